"""Connector counters, shared by the scheduler and worker halves.

Each half counts into its own :class:`Counters`; vLLM collects the per-interval deltas through the
connector stats hook (``get_kv_connector_stats``), sums them across workers and hands them to its
loggers and to the Prometheus metrics of :mod:`tierkv.connectors.vllm.metrics`. ``totals`` stays
cumulative for tests and ``tierkv status``-style reporting.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

COUNTERS: tuple[str, ...] = (
    "lookups",
    "lookup_hit_tokens",
    "restore_tokens",
    "restore_requests",
    "restored_blocks",
    "restored_bytes",
    "load_errors",
    "store_requests",
    "stored_blocks",
    "stored_bytes",
    "store_skipped_blocks",
    "store_failures",
    "store_rejected",
    "store_lagging",
    "stores_dropped",
    "snapshot_blocks",
    "layouts",
    "layouts_rejected",
    "kv_events",
    "kv_events_dropped",
    "gpu_protect_holds",
    "gpu_protect_releases",
    "gpu_protect_pressure_releases",
    "gpu_protect_skipped",
    "evict_store_blocks",
    "evict_preempt_blocks",
    "evict_releases",
    "evict_unknown_blocks",
    "prefetch_hits",
    "prefetch_hit_bytes",
    "prefetch_fetched_bytes",
    "prefetch_wasted_bytes",
    "prefetch_gave_up",
    "prefetch_rejected",
    "lookup_us",
    "lookup_wait_us",
    "load_us",
    "load_get_us",
    "load_verify_us",
    "load_copy_us",
    "load_landed_blocks",
)
"""Every counter the connector reports, in a fixed order.

``lookups``/``lookup_hit_tokens``: prefix lookups answered and the tokens they found (scheduler; a prompt
may be looked up more than once, and on arrival also where vLLM's own cache holds it);
``restore_tokens``: prompt tokens vLLM took from the vaults instead of computing them (loads scheduled; a
block whose load fails is counted in ``load_errors`` and recomputed);
``restore_requests``/``restored_blocks``/``restored_bytes``: loads done; ``load_errors``: blocks whose
fetch, checksum, header or decode failed and were handed back to vLLM for recomputation;
``store_requests``/``stored_blocks``/``stored_bytes``: blobs the vaults' replies said they stored;
``store_skipped_blocks``: blocks already in the vaults; ``store_failures``: blocks not stored, of which
``store_rejected`` a vault refused (larger than its budget or the tenant's quota, or no room);
``store_lagging``: blocks stored with fewer copies than replication asks;
``stores_dropped``: store jobs refused because the bounded queue was full (back-pressure);
``snapshot_blocks``: recurrent-state snapshots taken mid-request; ``layouts``: requests whose prompt layout
tags their stored blocks, ``layouts_rejected``: malformed layouts ignored (scheduler); ``kv_events``:
cold-tier KV events queued, ``kv_events_dropped``: events refused because their queue was full;
``gpu_protect_*``: GPU prefix-cache blocks of protected prefixes held, released (all, and those released
for lack of free blocks) and not held (cap or pressure), see :mod:`tierkv.connectors.vllm.protect`;
``evict_*``: with ``store: "eviction"``, GPU blocks handed to the workers near eviction (of them for
preempted requests), references on them dropped, and cached blocks near eviction with no known key, see
:mod:`tierkv.connectors.vllm.eviction`; ``prefetch_*``: with ``[cluster] prefetch_bytes``, the workers'
prefetch buffers (:mod:`tierkv.tiering.prefetch`): blocks and bytes loads took from them, bytes fetched
and bytes evicted unused, jobs that gave up, blobs that failed verification. Where restore time goes, in
microseconds: ``lookup_us`` in the vaults' prefix lookups (lookup threads), ``lookup_wait_us`` of scheduler
steps waiting for them; ``load_us`` in load jobs, of which ``load_get_us`` in the gets (blobs written into
the cache as they arrive are verified and copied within it), ``load_verify_us`` verifying and decoding
blobs and ``load_copy_us`` copying them into the cache, wherever that happened; ``load_landed_blocks``
counts the blobs received straight into the cache (no copy; verified where they landed).
"""


class Counters:
    """Thread-safe monotonic counters with an interval view (``take``) and a cumulative one (``totals``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = dict.fromkeys(COUNTERS, 0)
        self._interval = dict.fromkeys(COUNTERS, 0)

    def add(self, name: str, value: int = 1) -> None:
        if name not in self._total:
            raise KeyError(f"unknown counter {name!r}")
        if value:
            with self._lock:
                self._total[name] += value
                self._interval[name] += value

    def take(self) -> dict[str, int]:
        """The non-zero increments since the last call (empty when nothing happened)."""
        with self._lock:
            out = {k: v for k, v in self._interval.items() if v}
            self._interval = dict.fromkeys(COUNTERS, 0)
        return out

    def totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._total)


PREFETCH_FIELDS: dict[str, str] = {
    "hits": "prefetch_hits",
    "hit_bytes": "prefetch_hit_bytes",
    "fetched_bytes": "prefetch_fetched_bytes",
    "wasted_bytes": "prefetch_wasted_bytes",
    "gave_up": "prefetch_gave_up",
    "rejected": "prefetch_rejected",
}
"""Field of :class:`~tierkv.tiering.prefetch.PrefetchStats` -> the connector counter it feeds."""


class PrefetchFeed:
    """Feeds a prefetcher's cumulative counters into :class:`Counters` as increments since the last call,
    so they reach vLLM's stats pipeline (and Prometheus) like every other counter."""

    def __init__(self, counters: Counters) -> None:
        self._counters = counters
        self._seen = dict.fromkeys(PREFETCH_FIELDS, 0)
        self._lock = threading.Lock()

    def update(self, stats: object) -> None:
        with self._lock:
            for field, name in PREFETCH_FIELDS.items():
                now = int(getattr(stats, field))
                self._counters.add(name, now - self._seen[field])
                self._seen[field] = now


def merge(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """Sum two counter mappings (workers' and the scheduler's increments)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


__all__ = ["COUNTERS", "Counters", "merge"]
