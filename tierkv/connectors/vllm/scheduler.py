"""The scheduler half of the connector: decides what to restore and what to store, never moves bytes.

It holds no vLLM types beyond what it reads from requests (``request_id``, ``num_tokens``,
``block_hashes`` ...), so its rules live in :mod:`tierkv.connectors.vllm.plan` and its behaviour is
tested against vLLM's real ``Scheduler``.

Prefix lookups run on a small thread pool. A request's whole prompt is looked up as it arrives
(``lookup_on_arrival``; models without recurrent state), so that by the time vLLM schedules it (at once on an
idle engine, steps later on a busy one) the answer is in or on its way; the first
``get_num_new_matched_tokens`` answers from it when it covers the blocks past vLLM's local hit, and
otherwise starts a lookup of those. Either is waited for while the step's wait budget (``lookup_wait_s``)
lasts; a lookup that did not finish in time answers ``None`` ("ask again") and later calls answer from it
once it has. Each lookup is the pipeline's ``lookup_all`` over the stored streams of every TP/PP rank
(one leased prefix lookup per stream and rank, each of the keys the ones before it held) plus, for hybrid
models, a few single-key probes for the recurrent state at the hit's last block. A vault that is down
answers "nothing" within its deadline.

A request's prompt layout (:mod:`tierkv.connectors.vllm.hints`) is read once, when the request arrives,
and turned into block metadata (parents = the request's chain of keys) in each of its store jobs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tierkv.connectors.vllm.hints import RequestLayouts
from tierkv.connectors.vllm.plan import (
    KV,
    BlockRef,
    LoadJob,
    StepJobs,
    StoreJob,
    Stream,
    Topology,
    Window,
    claimed_tokens,
    finished_refs,
    load_refs,
    restore_window,
    snapshot_refs,
    state_candidates,
)
from tierkv.connectors.vllm.stats import Counters
from tierkv.retention import BlockMeta, Chunk, Retention
from tierkv.tiering import ColdTier, LazyStorage, NumpyArrays, Storage, StreamSpec

if TYPE_CHECKING:
    from tierkv.connectors.vllm.events import ColdEvents
    from tierkv.connectors.vllm.eviction import EvictionStore, HashOf

logger = logging.getLogger(__name__)


KeyFunction = Callable[[Any], list[bytes]]
"""Block keys of a request, one per full block of the topology's block size."""


class LookupClock(Protocol):
    """Time as the lookups see it: a monotonic clock and a bounded wait for lookups. Injected in tests,
    so that wait budgets and lease ages are checked without wall-clock bounds."""

    def monotonic(self) -> float: ...

    def wait(self, futures: Sequence[Future[int]], timeout: float) -> None:
        """Return when every future is done or ``timeout`` seconds have passed."""
        ...


class SystemClock:
    """The real :class:`LookupClock`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, futures: Sequence[Future[int]], timeout: float) -> None:
        wait(futures, timeout=timeout)


@dataclass
class _Lookup:
    """A lookup of the blocks of ``window``: ``future`` gives how many leading blocks the vaults hold."""

    window: Window
    future: Future[int]
    started: float
    waited: bool = False

    def covers(self, window: Window, max_age: float, now: float) -> bool:
        """Whether this lookup may answer for ``window``: it spans it and its lease (if any) is young."""
        fresh = max_age <= 0 or now - self.started < max_age
        return fresh and self.window.start <= window.start and window.stop <= self.window.stop

    def hits_in(self, window: Window) -> int | None:
        """Leading blocks of ``window`` held (after :meth:`covers` and once done); None when this lookup's
        leading run ends before ``window`` starts, which says nothing about the blocks of ``window``."""
        end = self.window.start + self.future.result()
        if end < window.start:
            return None
        return min(end, window.stop) - window.start

    def resolved(self, window: Window) -> _Lookup | None:
        """This (done) lookup's answer for ``window`` as a lookup of its own, or None if it has none."""
        hits = self.hits_in(window)
        if hits is None:
            return None
        done: Future[int] = Future()
        done.set_result(hits)
        return _Lookup(window, done, self.started)


class SchedulerSide:
    """Lookups, claims and the per-step job lists."""

    def __init__(
        self,
        topology: Topology,
        namespaces: Mapping[Stream, Sequence[bytes]],
        storage_factory: Callable[[], Storage],
        block_keys: KeyFunction,
        *,
        forget: Callable[[str], None] | None = None,
        restores: bool = True,
        stores: bool = True,
        sync_loads: bool = False,
        max_state_probes: int = 4,
        lookup_threads: int = 2,
        lookup_lease_ms: int = 0,
        lookup_wait_s: float = 0.0,
        lookup_on_arrival: bool = True,
        counters: Counters | None = None,
        retention: Retention | None = None,
        events: ColdEvents | None = None,
        eviction: EvictionStore | None = None,
        clock: LookupClock | None = None,
    ) -> None:
        self.topology = topology
        self.clock: LookupClock = clock or SystemClock()
        self.eviction = eviction
        self.namespaces = {s: tuple(ns) for s, ns in namespaces.items()}
        self.block_keys = block_keys
        self.events = events
        self.restores = restores
        self.stores = stores
        # vLLM can take failed blocks of a synchronous load only when block ids are unique (one group).
        self.sync_loads = sync_loads and len(topology.groups) == 1
        self._forget = forget
        self.max_state_probes = max_state_probes
        self.lookup_lease_ms = lookup_lease_ms
        self.lookup_wait_s = lookup_wait_s
        self.lookup_on_arrival = lookup_on_arrival and not topology.state_groups
        self._wait_left = lookup_wait_s
        self.counters = counters or Counters()
        self.layouts = RequestLayouts(self.counters, retention)
        self._storage = LazyStorage(storage_factory)
        self._tier: ColdTier[np.ndarray] = ColdTier(self._storage, NumpyArrays())  # lookups only
        specs = [(s, StreamSpec(ns, s.layer_group)) for s, nss in self.namespaces.items() for ns in nss]
        self._kv_specs = [spec for s, spec in specs if s.kind == KV]
        self._state_specs = [spec for s, spec in specs if s.kind != KV]
        self._pool = ThreadPoolExecutor(lookup_threads, thread_name_prefix="tierkv-lookup")
        self._lookups: dict[str, _Lookup] = {}
        self._requests: dict[str, Any] = {}
        self._chunks: dict[str, list[Chunk] | None] = {}
        self._jobs = StepJobs()
        self._sending: set[str] = set()
        self._loading: set[str] = set()

    @property
    def storage(self) -> Storage:
        """The vaults, opened on first use by whichever lookup thread comes first."""
        return self._storage.get()

    # -- restore -----------------------------------------------------------------------------------

    def track(self, request: Any) -> None:
        """Remember a new request (recurrent-state snapshots are offered by request id) and its layout."""
        self._requests[request.request_id] = request
        self._chunks[request.request_id] = self.layouts.chunks(request)
        if self.lookup_on_arrival and self.restores and self.topology.restorable:
            keys = self.block_keys(request)
            window = restore_window(request.num_tokens, 0, self.topology.block_size, len(keys))
            if window.size:
                self._start_lookup(request.request_id, keys, window)

    def layout(self, request: Any) -> list[Chunk] | None:
        """The request's prompt layout, as read when it arrived (None: it has none)."""
        rid = request.request_id
        return self._chunks[rid] if rid in self._chunks else self.layouts.chunks(request)

    def _meta(
        self, request: Any, keys: Sequence[bytes], refs: Sequence[BlockRef]
    ) -> dict[bytes, BlockMeta] | None:
        """The metadata of the blocks ``refs`` store, when the request came with a layout."""
        meta = self.layouts.block_meta(self.layout(request), request, keys, self.topology.block_size)
        if meta is None:
            return None
        return {r.key: meta[r.key] for r in refs if r.key in meta}

    def matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """vLLM's ``get_num_new_matched_tokens``: tokens loadable past the local hit, and "async"."""
        if not (self.restores and self.topology.restorable):
            return 0, False
        keys = self.block_keys(request)
        window = restore_window(request.num_tokens, num_computed_tokens, self.topology.block_size, len(keys))
        if window.size == 0:
            return 0, False
        entry = self._answering(request.request_id, keys, window)
        if entry is None:
            return None, False
        hits = entry.future.result()
        if self.events is not None and hits < window.size:
            # A block announced as stored that a lookup no longer finds has left the vaults.
            self.events.gone(keys[window.start + hits : window.start + hits + 1])
        tokens = claimed_tokens(window, hits, self.topology.block_size)
        return (tokens, not self.sync_loads) if tokens else (0, False)

    def _answering(self, rid: str, keys: list[bytes], window: Window) -> _Lookup | None:
        """The done lookup that answers for ``window`` (this request's earlier one where it can, a new
        one otherwise), or None while it runs past this step's wait budget."""
        entry = self._lookups.get(rid)
        if entry is not None and entry.window != window:
            # an earlier lookup of a wider window (the one started on arrival) may answer for this one
            if entry.covers(window, self.lookup_lease_ms / 2000, self.clock.monotonic()):
                self._wait(entry)
                if not entry.future.done():
                    return None
                entry = entry.resolved(window)
            else:
                entry = None
        if entry is None:
            entry = self._start_lookup(rid, keys, window)
        self._wait(entry)
        if not entry.future.done():
            return None
        self._lookups[rid] = entry
        return entry

    def _start_lookup(self, rid: str, keys: list[bytes], window: Window) -> _Lookup:
        future = self._pool.submit(self._lookup, keys[window.start : window.stop], window)
        entry = self._lookups[rid] = _Lookup(window, future, self.clock.monotonic())
        return entry

    def _wait(self, entry: _Lookup) -> None:
        """Wait for a lookup the first time vLLM asks about it, while this step's budget lasts: one the
        vaults answer in a millisecond is then used at once, instead of after another engine step (and the
        lookup thread gets the GIL meanwhile, which a spinning step loop would hold). Never again for the
        same lookup: a slow vault delays one step, not every step until its deadline."""
        if entry.waited or entry.future.done() or self._wait_left <= 0:
            return
        entry.waited = True
        start = self.clock.monotonic()
        self.clock.wait([entry.future], self._wait_left)
        waited = self.clock.monotonic() - start
        self._wait_left -= waited
        self.counters.add("lookup_wait_us", round(waited * 1e6))

    def _lookup(self, keys: list[bytes], window: Window) -> int:
        """Leading blocks of ``keys`` that every stream of every rank holds (0 on any failure)."""
        start = time.perf_counter()
        try:
            hits = self._kv_hits(keys, self.lookup_lease_ms)
            if hits and self.topology.state_groups:
                hits = self._state_hits(keys, window, hits)
        except Exception:
            logger.exception("prefix lookup failed; treating it as a miss")
            hits = 0
        self.counters.add("lookup_us", round((time.perf_counter() - start) * 1e6))
        self.counters.add("lookups")
        self.counters.add("lookup_hit_tokens", hits * self.topology.block_size)
        return hits

    def vault_hits(self, keys: list[bytes]) -> int:
        """Leading blocks of ``keys`` whose KV every rank's vaults hold (the cold-event audit's check)."""
        return self._kv_hits(keys)

    def _kv_hits(self, keys: list[bytes], lease_ms: int = 0) -> int:
        """``lease_ms`` only for a lookup the engine may load from (the audit takes no lease)."""
        return self._tier.lookup_all(self._kv_specs, keys, lease_ms=lease_ms)

    def _state_hits(self, keys: list[bytes], window: Window, kv_hits: int) -> int:
        for blocks in state_candidates(Window(0, window.size), kv_hits, self.max_state_probes):
            last = keys[blocks - 1 : blocks]
            if self._tier.lookup_all(self._state_specs, last, lease_ms=self.lookup_lease_ms):
                return blocks
        return 0

    def after_alloc(self, request: Any, block_ids: Sequence[Sequence[int]], num_external_tokens: int) -> None:
        """vLLM's ``update_state_after_alloc``: plan the load of the tokens it accepted."""
        if num_external_tokens <= 0:
            return
        entry = self._lookups.pop(request.request_id, None)
        if entry is None:
            logger.error(
                "request %s: load of %d tokens without a lookup", request.request_id, num_external_tokens
            )
            return
        bs = self.topology.block_size
        window = Window(entry.window.start, entry.window.start + num_external_tokens // bs)
        refs = load_refs(self.topology, self.block_keys(request), block_ids, window)
        broken = refs is None
        if refs is None:
            logger.error("request %s: vLLM allocated no block for part of the load", request.request_id)
            refs = [
                BlockRef(g.index, pos, block_ids[g.index][pos], b"")
                for g in self.topology.kv_groups
                for pos in range(window.start, min(window.stop, len(block_ids[g.index])))
            ]
        self._jobs.loads.append(LoadJob(request.request_id, tuple(refs), broken=broken, sync=self.sync_loads))
        self.counters.add("restore_tokens", num_external_tokens)
        if not self.sync_loads:
            # Until the worker reports it in finished_recving; sync loads are done within their step.
            self._loading.add(request.request_id)

    # -- store -------------------------------------------------------------------------------------

    def finished(self, request: Any, block_ids: Sequence[Sequence[int]]) -> bool:
        """vLLM's ``request_finished_all_groups``: True when the blocks must wait for a store."""
        self._requests.pop(request.request_id, None)
        self._lookups.pop(request.request_id, None)
        refs: list[BlockRef] = []
        meta = None
        # A request aborted while its blocks were still loading holds nothing worth storing yet.
        if self.stores and request.request_id not in self._loading:
            keys = self.block_keys(request)
            refs = finished_refs(self.topology, keys, block_ids, request.num_computed_tokens)
            meta = self._meta(request, keys, refs) if refs else None
            if self.eviction is not None and refs:
                # Store on eviction: remember the keys, ship when the blocks are about to be reused.
                self.eviction.remember(block_ids, keys, meta, request.num_computed_tokens)
                refs = []
        self._chunks.pop(request.request_id, None)
        if self._forget is not None:
            self._forget(request.request_id)
        if not refs:
            return False
        self._jobs.stores.append(StoreJob(request.request_id, tuple(refs), meta=meta))
        if self.events is not None:
            first = refs[0].group
            self.events.expect(request, first, {r.key: r.position for r in refs if r.group == first})
        self._sending.add(request.request_id)
        return True

    def evictions(self, preempted: Iterable[str], hash_of: HashOf) -> None:
        """Store on eviction: this step's walk over the GPU free queue and the preempted requests."""
        if self.eviction is None or not self.stores:
            return
        for req_id in preempted:
            request = self._requests.get(req_id)
            if request is None:
                continue
            keys = self.block_keys(request)
            refs = [BlockRef(0, pos, 0, key) for pos, key in enumerate(keys)]
            meta = self._meta(request, keys, refs)
            self._jobs.stores += self.eviction.preempted(request.block_hashes, keys, meta, hash_of)
        self._jobs.stores += self.eviction.walk()

    def take_jobs(self, boundary_offers: Mapping[str, Sequence[tuple[int, int, int]]]) -> StepJobs:
        """vLLM's ``build_connector_meta``: this step's jobs, with the recurrent-state snapshots offered."""
        jobs, self._jobs = self._jobs, StepJobs()
        self._wait_left = self.lookup_wait_s
        if self.stores and self.topology.state_groups:
            for req_id, offers in boundary_offers.items():
                request = self._requests.get(req_id)
                if request is None:
                    continue
                keys = self.block_keys(request)
                refs = snapshot_refs(self.topology, keys, offers)
                if refs:
                    meta = self._meta(request, keys, refs)
                    jobs.stores.append(StoreJob(req_id, tuple(refs), snapshot=True, meta=meta))
        return jobs

    def transfers_done(self, sent: set[str], received: set[str]) -> None:
        """Requests whose stores (``sent``) or loads (``received``) the workers reported finished."""
        self._sending -= sent
        self._loading -= received

    def forget_lookups(self) -> None:
        """Drop finished lookups so the next question asks the vaults again."""
        self._lookups = {k: v for k, v in self._lookups.items() if not v.future.done()}

    @property
    def pending_stores(self) -> int:
        return len(self._sending)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._storage.close()


__all__ = ["KeyFunction", "LookupClock", "SchedulerSide", "SystemClock"]
