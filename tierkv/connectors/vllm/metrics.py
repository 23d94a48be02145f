"""The connector's counters in vLLM's stats pipeline: interval logging and Prometheus.

vLLM sums the :class:`TierKVStats` of every worker and of the scheduler each step, logs the reduced
values ("KV Transfer metrics: ...") and feeds them to :class:`TierKVPromMetrics`, which exports one
counter per :data:`~tierkv.connectors.vllm.stats.COUNTERS` entry as ``tierkv_connector_<name>_total``
(hit rate = ``lookup_hit_tokens`` over vLLM's own prompt-token counters), plus the gauge
:data:`HELD_GAUGE` of GPU blocks held for protected prefixes.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

from tierkv.connectors.vllm.stats import COUNTERS, merge

logger = logging.getLogger(__name__)

_HELP = {
    "lookups": "Prefix lookups answered by the vaults",
    "lookup_hit_tokens": "Prompt tokens the vaults' lookups found (a prompt may be looked up more than once)",
    "restore_tokens": "Prompt tokens vLLM loaded from the vaults instead of computing them",
    "restore_requests": "Requests whose blocks were loaded",
    "restored_blocks": "Blocks loaded into the KV cache",
    "restored_bytes": "Bytes of blobs loaded",
    "load_errors": "Blocks whose load failed and were recomputed",
    "store_requests": "Finished requests stored",
    "stored_blocks": "Blobs the vaults' replies said they stored",
    "stored_bytes": "Bytes of the blobs the vaults stored",
    "store_skipped_blocks": "Blocks not stored because the vaults already held them",
    "store_failures": "Blobs no vault stored (refused, failed or late)",
    "store_rejected": "Blobs a vault refused and none stored (budget, tenant quota or no room)",
    "store_lagging": "Blobs stored with fewer copies than replication asks",
    "stores_dropped": "Store jobs dropped because the bounded store queue was full",
    "snapshot_blocks": "Recurrent-state snapshots taken at block boundaries",
    "layouts": "Requests whose prompt layout tags the blocks they store",
    "layouts_rejected": "Malformed prompt layouts ignored (the request was served and stored untagged)",
    "kv_events": "Cold-tier KV events (BlockStored / BlockRemoved, medium STORAGE) queued for vLLM",
    "kv_events_dropped": "Cold-tier KV events dropped because their bounded queue was full",
    "gpu_protect_holds": "GPU prefix-cache blocks of protected prefixes held out of eviction",
    "gpu_protect_releases": "Held GPU blocks released (pressure, cap displacement, reset, shutdown)",
    "gpu_protect_pressure_releases": "Held GPU blocks released because free blocks fell below the watermark",
    "gpu_protect_skipped": "Protected GPU blocks not held (cap reached or free blocks below the watermark)",
    "evict_store_blocks": "GPU blocks near eviction handed to the workers (store: eviction)",
    "evict_preempt_blocks": "GPU blocks of preempted requests handed to the workers (store: eviction)",
    "evict_releases": "References on GPU blocks being stored dropped (store: eviction)",
    "evict_unknown_blocks": "Cached GPU blocks near eviction with no known tierkv key (store: eviction)",
    "prefetch_hits": "Blocks loads took from the workers' prefetch buffers",
    "prefetch_hit_bytes": "Bytes loads took from the workers' prefetch buffers",
    "prefetch_fetched_bytes": "Bytes prefetched into the workers' buffers",
    "prefetch_wasted_bytes": "Prefetched bytes evicted from the buffers unused",
    "prefetch_gave_up": "Prefetch jobs cut short by their deadline or a vault failure",
    "prefetch_rejected": "Prefetched blobs that failed verification",
    "lookup_us": "Microseconds the vaults' prefix lookups took (lookup threads)",
    "lookup_wait_us": "Microseconds scheduler steps waited for new requests' lookups (lookup_wait_ms)",
    "load_us": "Microseconds load jobs took",
    "load_get_us": "Microseconds of loads spent in gets (blobs placed on arrival are copied within it)",
    "load_verify_us": "Microseconds of loads spent verifying and decoding blobs",
    "load_copy_us": "Microseconds of loads spent copying blocks into the KV cache",
    "load_landed_blocks": "Blobs received straight into the KV cache (verified there, never copied)",
}
HELD_GAUGE = "tierkv_connector_gpu_protect_held_blocks"
"""Blocks held now: ``gpu_protect_holds`` minus ``gpu_protect_releases``, kept as a gauge."""


class TierKVStats(KVConnectorStats):  # type: ignore[misc]
    """A flat ``{counter: increment}`` mapping; aggregation is a sum."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        self.data = merge(self.data, {k: int(v) for k, v in other.data.items()})
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: int(v) for k, v in sorted(self.data.items())}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class TierKVPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """One Prometheus counter per connector counter, labelled like vLLM's own metrics."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._children: dict[tuple[int, str], Any] = {}
        for name in COUNTERS:
            metric = self._counter_cls(
                name=f"tierkv_connector_{name}", documentation=_HELP[name], labelnames=labelnames
            )
            for engine, values in per_engine_labelvalues.items():
                self._children[(engine, name)] = metric.labels(*values)
        held = self._gauge_cls(
            name=HELD_GAUGE,
            documentation="GPU prefix-cache blocks tierkv holds for protected prefixes",
            multiprocess_mode="mostrecent",
            labelnames=labelnames,
        )
        self._held = {engine: held.labels(*values) for engine, values in per_engine_labelvalues.items()}
        # vLLM's multiprocess gauges ("mostrecent") only take set(): keep the running value here.
        self._held_now = dict.fromkeys(per_engine_labelvalues, 0)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            child = self._children.get((engine_idx, name))
            if child is not None and value:
                child.inc(value)
        held = self._held.get(engine_idx)
        change = int(transfer_stats_data.get("gpu_protect_holds", 0)) - int(
            transfer_stats_data.get("gpu_protect_releases", 0)
        )
        if held is not None and change:
            self._held_now[engine_idx] += change
            held.set(self._held_now[engine_idx])


__all__ = ["HELD_GAUGE", "TierKVPromMetrics", "TierKVStats"]
