"""KV events for the cold tier: ``BlockStored`` / ``BlockRemoved`` with ``medium="STORAGE"``.

Routers that build a cluster prefix index from vLLM's KV events (vllm-router ``kv_aware``, llm-d,
Dynamo) credit a prefix by the tier named in each event's medium; announcing what the vaults hold lets
them count the cold tier, below GPU and host hits. vLLM 0.32 publishes what the scheduler-side
connector's ``take_events()`` returns, every step, next to its own events.

Only the worker knows which blobs the vaults acknowledged, and only the scheduler knows vLLM's block
hashes and token ids, so the worker reports acknowledged and vanished keys in its
``build_connector_worker_meta()`` (:class:`TierKVWorkerMeta`, vLLM aggregates one per worker) and the
scheduler turns them into events in ``update_connector_output()``. With several workers a block is
announced once the first rank acknowledged it.

A vault evicts without telling anyone, so :meth:`ColdEvents.watch` re-checks the announced runs in the
background (a prefix lookup per run, a bounded number per pass) and announces the removal of what left;
a lookup that misses during a request does the same at once. Events leave with vLLM's next engine step,
so an idle replica's removals wait for its next request.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_events import MEDIUM_STORAGE, BlockRemoved, BlockStored, KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from tierkv.connectors.vllm.stats import Counters

log = logging.getLogger(__name__)

MAX_ANNOUNCED = 1 << 18
"""Announced blocks remembered (to announce their removal); the oldest are forgotten first."""

AUDIT_INTERVAL = 5.0
"""Seconds between two background checks that announced blocks are still in the vaults."""

AUDIT_RUNS = 256
"""Announced runs checked per pass (one prefix lookup each), oldest checked first, round robin."""

Hits = Callable[[list[bytes]], int]
"""How many leading keys of a list the vaults hold (the scheduler's prefix lookup)."""


@dataclass
class TierKVWorkerMeta(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """What one worker learned since its last report: keys acknowledged per request, keys gone."""

    stored: dict[str, list[bytes]] = field(default_factory=dict)
    gone: list[bytes] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if not isinstance(other, TierKVWorkerMeta):
            return self
        merged = TierKVWorkerMeta({k: list(v) for k, v in self.stored.items()}, self.gone + other.gone)
        for req_id, keys in other.stored.items():
            merged.stored.setdefault(req_id, []).extend(keys)
        return merged

    def __bool__(self) -> bool:
        return bool(self.stored or self.gone)


class WorkerReport:
    """The worker's side: collects acknowledged and vanished keys between two reports (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._meta = TierKVWorkerMeta()

    def stored(self, req_id: str, keys: Iterable[bytes]) -> None:
        with self._lock:
            self._meta.stored.setdefault(req_id, []).extend(keys)

    def gone(self, keys: Iterable[bytes]) -> None:
        with self._lock:
            self._meta.gone.extend(keys)

    def take(self) -> TierKVWorkerMeta | None:
        with self._lock:
            meta, self._meta = self._meta, TierKVWorkerMeta()
        return meta or None


@dataclass(frozen=True)
class _Pending:
    """A finished request whose store is running: where each key sits, and what vLLM hashed."""

    positions: dict[bytes, int]
    group: int
    hashes: tuple[bytes, ...]
    tokens: tuple[int, ...]
    lora_id: int | None
    lora_name: str | None


class ColdEvents:
    """The scheduler's side: turns worker reports into vLLM events, in a bounded queue.

    ``hash_block_size`` is vLLM's hash granularity and ``block_size`` the connector's; a connector block
    covers ``block_size // hash_block_size`` of vLLM's hashes, all announced together. A full queue
    drops the newest events and counts them (``kv_events_dropped``): a router then misses a cold hit,
    nothing else.
    """

    def __init__(self, block_size: int, hash_block_size: int, max_queued: int, counters: Counters) -> None:
        self.block_size = block_size
        self.hash_block_size = hash_block_size
        self.ratio = max(block_size // max(hash_block_size, 1), 1)
        self.max_queued = max_queued
        self.counters = counters
        self._lock = threading.Lock()
        self._queue: deque[KVCacheEvent] = deque()
        self._pending: dict[str, _Pending] = {}
        self._announced: OrderedDict[bytes, tuple[list[Any], int]] = OrderedDict()
        self._runs: deque[list[bytes]] = deque(maxlen=MAX_ANNOUNCED)
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def expect(self, request: Any, group: int, positions: dict[bytes, int]) -> None:
        """A store of ``request``'s blocks (key → block position in ``group``) was queued."""
        lora = getattr(request, "lora_request", None)
        pending = _Pending(
            positions,
            group,
            tuple(request.block_hashes),
            tuple(request.all_token_ids),
            lora.adapter_id if lora is not None else None,
            lora.name if lora is not None else None,
        )
        with self._lock:
            self._pending[request.request_id] = pending

    def report(self, meta: Any) -> None:
        """A worker report (:class:`TierKVWorkerMeta`): announce what was stored, then what is gone."""
        if not isinstance(meta, TierKVWorkerMeta):
            return
        for req_id, keys in meta.stored.items():
            self.stored(req_id, keys)
        self.gone(meta.gone)

    def stored(self, req_id: str, keys: Sequence[bytes]) -> None:
        """The vaults acknowledged ``keys`` of ``req_id``'s store: one event per contiguous run."""
        with self._lock:
            pending = self._pending.pop(req_id, None)
            if pending is None:
                return
            positions = sorted({pending.positions[k] for k in keys if k in pending.positions})
            run: list[int] = []
            for pos in positions:
                if run and pos != run[-1] + 1:
                    self._announce(pending, run)
                    run = []
                run.append(pos)
            if run:
                self._announce(pending, run)

    def _announce(self, pending: _Pending, run: list[int]) -> None:
        r, first = self.ratio, run[0]
        lo, hi = first * r, (run[-1] + 1) * r
        if hi > len(pending.hashes):
            return
        hashes = [maybe_convert_block_hash(h) for h in pending.hashes[lo:hi]]
        parent = maybe_convert_block_hash(pending.hashes[lo - 1]) if lo else None
        event = BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=list(pending.tokens[lo * self.hash_block_size : hi * self.hash_block_size]),
            block_size=self.hash_block_size,
            lora_id=pending.lora_id,
            medium=MEDIUM_STORAGE,
            lora_name=pending.lora_name,
            group_idx=pending.group,
        )
        by_key = {k: p for k, p in pending.positions.items() if first <= p <= run[-1]}
        self._runs.append(sorted(by_key, key=by_key.__getitem__))
        for key, pos in by_key.items():
            self._announced[key] = (hashes[(pos - first) * r : (pos - first + 1) * r], pending.group)
            self._announced.move_to_end(key)
        while len(self._announced) > MAX_ANNOUNCED:
            self._announced.popitem(last=False)
        self._push(event)

    def gone(self, keys: Iterable[bytes]) -> None:
        """``keys`` are no longer in the vaults: announce the removal of those announced before."""
        with self._lock:
            for key in keys:
                entry = self._announced.pop(key, None)
                if entry is not None:
                    hashes, group = entry
                    self._push(BlockRemoved(block_hashes=hashes, medium=MEDIUM_STORAGE, group_idx=group))

    def audit(self, hits: Hits, max_runs: int = AUDIT_RUNS) -> int:
        """Check up to ``max_runs`` announced runs against the vaults; announce what left. Blocks gone.

        A run is cut at its first missing block: a restore reads leading blocks only, so what follows
        a hole is unreachable too. A failed lookup checks nothing (the vaults may be back next pass).
        """
        with self._lock:
            runs = [self._runs.popleft() for _ in range(min(max_runs, len(self._runs)))]
        keep: list[list[bytes]] = []
        lost: list[bytes] = []
        for run in runs:
            live = [k for k in run if k in self._announced]
            if not live:
                continue
            try:
                held = hits(live)
            except Exception:  # a vault down: keep the run, retry next pass
                log.debug("cold-tier audit lookup failed", exc_info=True)
                held = len(live)
            lost.extend(live[held:])
            if held:
                keep.append(live[:held])
        with self._lock:
            self._runs.extend(keep)
        self.gone(lost)
        return len(lost)

    def watch(self, hits: Hits, interval: float = AUDIT_INTERVAL) -> None:
        """Audit every ``interval`` seconds in a daemon thread until :meth:`close`."""
        if self._watcher is not None:
            return

        def loop() -> None:
            while not self._stop.wait(interval):
                self.audit(hits)

        self._watcher = threading.Thread(target=loop, name="tierkv-cold-audit", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)

    def _push(self, event: KVCacheEvent) -> None:
        if len(self._queue) >= self.max_queued:
            self.counters.add("kv_events_dropped")
            return
        self._queue.append(event)
        self.counters.add("kv_events")

    def take(self) -> list[KVCacheEvent]:
        """Every queued event, oldest first (vLLM's ``take_events``)."""
        with self._lock:
            events = list(self._queue)
            self._queue.clear()
        return events


__all__ = [
    "AUDIT_INTERVAL",
    "AUDIT_RUNS",
    "MAX_ANNOUNCED",
    "ColdEvents",
    "Hits",
    "TierKVWorkerMeta",
    "WorkerReport",
]
