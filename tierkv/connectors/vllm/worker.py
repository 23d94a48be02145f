"""The worker half of the connector: moves blocks between vLLM's paged caches and the vaults.

This is the vLLM adapter over the pipeline (:mod:`tierkv.tiering`): it owns the job bookkeeping, the
chunking and the copies out of and back into vLLM's paged caches; encoding, batching, putting, fetching,
verifying, decoding and dropping corrupt blobs are the pipeline's :class:`~tierkv.tiering.ColdTier`.
Nothing here runs on the step loop except taking jobs and, for recurrent-state snapshots that vLLM does
not keep for us, one copy of the offered blocks. Everything else runs on background threads:

- a load writes only into blocks vLLM allocated for the waiting request, and the request is reported in
  ``finished_recving`` once every block was written or reported as failed;
- a finished request's blocks stay allocated until it is reported in ``finished_sending``, which happens
  after the vaults acknowledged (or refused) its blobs. At most ``max_inflight_stores`` stores run and
  ``max_queued_stores`` wait; beyond that a store is dropped and counted (a miss later, never a stall).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from tierkv.codec.torch_codec import dtype_name
from tierkv.connectors.vllm.layout import KVGroupView, StateGroupView
from tierkv.connectors.vllm.plan import BlockRef, LoadJob, StepJobs, StoreJob, Stream, Topology
from tierkv.connectors.vllm.stats import Counters, PrefetchFeed
from tierkv.tiering import Block, ColdTier, Expect, LazyStorage, Storage, StoreTally, StreamSpec
from tierkv.tiering.tensors import TorchArrays

if TYPE_CHECKING:
    from tierkv.connectors.vllm.events import WorkerReport

logger = logging.getLogger(__name__)

CHUNK_BLOCKS = 64
"""Blocks copied out of (or fetched into) the KV cache at a time, bounding the memory a transfer holds.

A load received straight into the cache holds no such memory and takes all its blocks in one get."""

GroupView = KVGroupView | StateGroupView


@dataclass
class _Transfers:
    """Completion bookkeeping shared by the background threads and the step loop."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    loads_running: int = 0
    stores_pending: set[str] = field(default_factory=set)
    stores_done: set[str] = field(default_factory=set)
    finished_seen: set[str] = field(default_factory=set)
    loads_done: set[str] = field(default_factory=set)
    loads_failed: set[str] = field(default_factory=set)
    error_blocks: set[int] = field(default_factory=set)
    queued_stores: int = 0
    held_done: list[str] = field(default_factory=list)


class WorkerSide:
    """Executes the scheduler's load and store jobs against the vaults.

    ``views`` maps each stream of the topology to the cache view it reads and writes; ``namespaces``
    maps it to this rank's namespace digest. ``per_block_errors`` says whether vLLM can take failed
    block ids (one KV-cache group) or needs whole failed requests (several groups).
    """

    def __init__(
        self,
        topology: Topology,
        views: Mapping[Stream, GroupView],
        namespaces: Mapping[Stream, bytes],
        storage_factory: Callable[[], Storage],
        *,
        codec: str = "raw",
        max_inflight_stores: int = 2,
        max_queued_stores: int = 64,
        load_threads: int = 2,
        counters: Counters | None = None,
        report: WorkerReport | None = None,
        prefetch_bytes: int = 0,
        prefetch_timeout_s: float = 0.5,
        decode_behind: bool = False,
    ) -> None:
        self.topology = topology
        self.report = report
        self.views = dict(views)
        self.namespaces = dict(namespaces)
        self.counters = counters or Counters()
        self.per_block_errors = len(topology.groups) == 1
        self._groups = {g.index: g for g in topology.groups}
        self._storage = LazyStorage(storage_factory)
        # loads run here, in the worker: prefetched blocks are served from this process's buffer
        self._tier: ColdTier[torch.Tensor] = ColdTier(
            self._storage,
            TorchArrays(),
            prefetch_bytes=prefetch_bytes,
            prefetch_timeout_s=prefetch_timeout_s,
            decode_behind=decode_behind,
        )
        self._prefetch_feed = PrefetchFeed(self.counters)
        self._specs = {s: StreamSpec(ns, s.layer_group, codec) for s, ns in self.namespaces.items()}
        self._expect: dict[Stream, Expect] = {
            s: self._specs[s].expect(v.block_shape, topology.block_size, dtype_name(v.dtype))
            for s, v in self.views.items()
            if s in self._specs
        }
        self._max_pending_stores = max_inflight_stores + max_queued_stores
        self._state = _Transfers()
        self._stores = ThreadPoolExecutor(max_inflight_stores, thread_name_prefix="tierkv-store")
        self._loads = ThreadPoolExecutor(load_threads, thread_name_prefix="tierkv-load")
        self._closed = False

    @property
    def storage(self) -> Storage:
        """The vaults, opened on first use (in the worker process, after fork)."""
        return self._storage.get()

    # -- step loop ---------------------------------------------------------------------------------

    def submit(self, jobs: StepJobs) -> None:
        """Start this step's jobs; only state snapshots are copied before returning."""
        for job in jobs.stores:
            if job.snapshot:
                self._submit_snapshot(job)
            else:
                self._submit_store(job)
        for load in jobs.loads:
            if load.sync:
                self._guarded_load(load)
            else:
                with self._state.cond:
                    self._state.loads_running += 1
                self._loads.submit(self._guarded_load, load)

    def finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str], set[str]]:
        """(done sending, done receiving, failed receiving) since the last call.

        A store is reported only once vLLM has listed its request as finished (vLLM's rule: finished
        saves must belong to a set it passed in).
        """
        st = self._state
        with st.cond:
            st.finished_seen |= finished_req_ids & (st.stores_pending | st.stores_done)
            sending = st.stores_done & st.finished_seen
            st.stores_done -= sending
            st.finished_seen -= sending
            recving, failed = st.loads_done, st.loads_failed
            st.loads_done, st.loads_failed = set(), set()
        return sending, recving, failed

    def wait_for_progress(self, timeout: float) -> None:
        """Block up to ``timeout`` while transfers run and none has finished yet.

        Called on steps where the engine has nothing to compute: instead of spinning through empty
        steps (holding the GIL the transfer threads need), the step loop sleeps until a transfer ends.
        """
        st = self._state
        with st.cond:
            busy = st.loads_running > 0 or st.queued_stores > 0
            if busy and not st.loads_done and not st.stores_done:
                st.cond.wait(timeout)

    def take_held_done(self) -> list[str]:
        """Held store jobs (evicted blocks) finished, refused or failed since the last call."""
        st = self._state
        with st.cond:
            done, st.held_done = st.held_done, []
        return done

    def take_load_errors(self) -> set[int]:
        """Block ids whose load failed since the last call (single-group models only)."""
        st = self._state
        with st.cond:
            errors, st.error_blocks = st.error_blocks, set()
        return errors

    def shutdown(self) -> None:
        """Let running transfers finish (each bounded by its RPC deadlines), then close the storage."""
        self._closed = True
        self._loads.shutdown(wait=True, cancel_futures=True)
        self._stores.shutdown(wait=True, cancel_futures=False)
        self._tier.close()
        self._storage.close()

    # -- stores ------------------------------------------------------------------------------------

    def _admit(self, req_id: str | None, held: bool = False) -> bool:
        """Take a place in the store queue, or count the store as dropped (never wait for one).

        ``req_id`` names a request whose blocks vLLM keeps until the store is reported; a refused one
        is reported at once. Snapshots were already copied out and pass ``None``.
        """
        st = self._state
        with st.cond:
            accept = not self._closed and st.queued_stores < self._max_pending_stores
            if accept:
                st.queued_stores += 1
            if held and req_id is not None:
                if not accept:
                    st.held_done.append(req_id)
            elif req_id is not None:
                (st.stores_pending if accept else st.stores_done).add(req_id)
        if not accept:
            if req_id is not None and self.report is not None:
                self.report.stored(req_id, ())
            self.counters.add("stores_dropped")
            logger.debug("store queue full: %s is not stored", req_id or "a state snapshot")
        return accept

    def _submit_store(self, job: StoreJob) -> None:
        if self._admit(job.req_id, job.held):
            self._stores.submit(self._guarded_store, job, None)

    def _submit_snapshot(self, job: StoreJob) -> None:
        """Copy offered state blocks now (vLLM may reuse them after this step), ship them later."""
        copies: dict[Stream, tuple[list[BlockRef], torch.Tensor]] = {}
        for stream, refs in self._by_stream(job.refs).items():
            view = self.views.get(stream)
            if view is not None and refs:
                copies[stream] = (refs, view.gather([r.block_id for r in refs]))
        if not copies:
            return
        self.counters.add("snapshot_blocks", sum(len(refs) for refs, _ in copies.values()))
        if self._admit(None):
            self._stores.submit(self._guarded_store, job, copies)

    def _guarded_store(
        self, job: StoreJob, copies: dict[Stream, tuple[list[BlockRef], torch.Tensor]] | None
    ) -> None:
        try:
            self._store(job, copies)
        except Exception:
            self.counters.add("store_failures", len(job.refs))
            logger.exception("store of request %s failed", job.req_id)
            if self.report is not None and not job.snapshot:
                self.report.stored(job.req_id, ())
        finally:
            st = self._state
            with st.cond:
                st.queued_stores -= 1
                if job.held:
                    st.held_done.append(job.req_id)
                elif not job.snapshot:
                    st.stores_pending.discard(job.req_id)
                    st.stores_done.add(job.req_id)
                st.cond.notify_all()

    def _store(self, job: StoreJob, copies: dict[Stream, tuple[list[BlockRef], torch.Tensor]] | None) -> None:
        tally = StoreTally()
        acked: list[bytes] = []
        skipped = 0
        for stream, wanted in self._by_stream(job.refs).items():
            view = self.views.get(stream)
            if view is None or not wanted:
                continue
            spec = self._specs[stream]
            if copies is not None and stream in copies:
                chunks: Iterable[tuple[list[BlockRef], torch.Tensor]] = [copies[stream]]
            else:
                present = self._tier.lookup(spec, [r.key for r in wanted])
                skipped += present
                acked.extend(r.key for r in wanted[:present])
                chunks = self._gathered(view, wanted[present:])
            tally.add(self._tier.store(spec, self._blocks(chunks), job.meta))
        if self.report is not None and not job.snapshot:
            self.report.stored(job.req_id, acked + tally.acked)
        self.counters.add("stored_blocks", tally.stored)
        self.counters.add("stored_bytes", tally.stored_bytes)
        self.counters.add("store_skipped_blocks", skipped)
        self.counters.add("store_failures", tally.failed)
        self.counters.add("store_rejected", tally.rejected)
        self.counters.add("store_lagging", tally.lagging)
        if not (job.snapshot or job.held):
            self.counters.add("store_requests")

    def _blocks(self, chunks: Iterable[tuple[list[BlockRef], torch.Tensor]]) -> Iterator[Block[torch.Tensor]]:
        """``(key, block, tokens)`` of each block, taken from the chunks as the pipeline asks for them."""
        for refs, data in chunks:
            for ref, block in zip(refs, data, strict=True):
                yield ref.key, block, self.topology.block_size

    @staticmethod
    def _gathered(view: GroupView, refs: list[BlockRef]) -> Iterator[tuple[list[BlockRef], torch.Tensor]]:
        """Copies of the blocks, ``CHUNK_BLOCKS`` at a time: a long request never doubles its KV in memory."""
        for i in range(0, len(refs), CHUNK_BLOCKS):
            chunk = refs[i : i + CHUNK_BLOCKS]
            yield chunk, view.gather([r.block_id for r in chunk])

    # -- loads -------------------------------------------------------------------------------------

    def _guarded_load(self, job: LoadJob) -> None:
        start = time.perf_counter()
        try:
            bad = list(job.refs) if job.broken else self._load(job)
        except Exception:
            logger.exception("load of request %s failed", job.req_id)
            bad = list(job.refs)
        self.counters.add("load_us", _us(time.perf_counter() - start))
        st = self._state
        with st.cond:
            if bad:
                if self.per_block_errors:
                    st.error_blocks.update(r.block_id for r in bad)
                else:
                    st.loads_failed.add(job.req_id)
            if not job.sync:
                st.loads_done.add(job.req_id)
                st.loads_running -= 1
            st.cond.notify_all()
        self.counters.add("load_errors", len(bad))
        self.counters.add("restore_requests")

    def _load(self, job: LoadJob) -> list[BlockRef]:
        """Fetch, verify, decode and write every block of ``job``; returns the blocks that failed."""
        bad: list[BlockRef] = []
        loaded = nbytes = 0
        for stream, refs in self._by_stream(job.refs).items():
            view = self.views.get(stream)
            if view is None:
                bad.extend(refs)
                continue
            step = len(refs) if self._lands(stream, view) else CHUNK_BLOCKS
            for i in range(0, len(refs), step):
                n, size = self._load_chunk(stream, view, refs[i : i + step], bad)
                loaded += n
                nbytes += size
        self.counters.add("restored_blocks", loaded)
        self.counters.add("restored_bytes", nbytes)
        if self._tier.prefetch is not None:
            self._prefetch_feed.update(self._tier.prefetch.stats)
        return bad

    def _load_chunk(
        self, stream: Stream, view: GroupView, refs: list[BlockRef], bad: list[BlockRef]
    ) -> tuple[int, int]:
        """One get, verified and written into the cache; failures appended to ``bad``.

        A ``raw`` stream on a CPU cache is written straight from the received bytes, block by block, as
        each blob verifies: one copy after the socket. Otherwise (int8, or a GPU cache) the pipeline
        decodes into one buffer on the cache's device (the n-th good block into row n; int8 blobs on CPU
        all at once, see :mod:`tierkv.codec.torch_rows`) and the good blocks are scattered into the cache
        at once.
        """
        spec, keys = self._specs[stream], [r.key for r in refs]
        scatter_s = 0.0
        if self._writes_in_place(stream, view):
            rows = None
            if isinstance(view, KVGroupView):
                rows = lambda i: view.byte_rows(refs[i].block_id)  # noqa: E731
            got = self._tier.restore(
                spec,
                keys,
                self._expect[stream],
                place=lambda i, block: view.write(refs[i].block_id, block),
                rows=rows,
            )
        else:
            buffer = torch.empty((len(refs), *view.block_shape), dtype=view.dtype, device=view.device)
            got = self._tier.restore(spec, keys, self._expect[stream], into=buffer)
            start = time.perf_counter()
            if got.decoded:
                view.scatter([refs[i].block_id for i in got.decoded], buffer[: len(got.decoded)])
            scatter_s = time.perf_counter() - start
        self.counters.add("load_get_us", _us(got.get_s))
        self.counters.add("load_verify_us", _us(got.verify_s))
        self.counters.add("load_copy_us", _us(got.place_s + scatter_s))
        self.counters.add("load_landed_blocks", got.landed)
        bad.extend(refs[i] for i in got.failed)
        if self.report is not None and got.gone:
            self.report.gone(got.gone)
        return len(got.decoded), got.decoded_bytes

    # -- helpers -----------------------------------------------------------------------------------

    def _writes_in_place(self, stream: Stream, view: GroupView) -> bool:
        """Whether blobs of ``stream`` go into the cache as they arrive (``raw`` on a CPU cache)."""
        return self._specs[stream].codec == "raw" and view.device.type == "cpu"

    def _lands(self, stream: Stream, view: GroupView) -> bool:
        """Whether blobs of ``stream`` are received straight into the cache's rows: such a load holds no
        buffer of its own, so it needs no chunking, and one get saves a round trip per chunk (the vault
        reads the next blob while the previous one is on the wire, and nothing waits between chunks)."""
        return isinstance(view, KVGroupView) and self._writes_in_place(stream, view)

    def _by_stream(self, refs: Sequence[BlockRef]) -> dict[Stream, list[BlockRef]]:
        out: dict[Stream, list[BlockRef]] = defaultdict(list)
        for ref in refs:
            group = self._groups.get(ref.group)
            if group is None:
                continue
            for stream in group.streams:
                out[stream].append(ref)
        return out


def _us(seconds: float) -> int:
    return round(seconds * 1e6)


__all__ = ["CHUNK_BLOCKS", "WorkerSide"]
