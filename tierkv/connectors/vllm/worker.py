"""The worker half of the connector: moves blocks between vLLM's paged caches and the vaults.

Nothing here runs on the step loop except taking jobs and, for recurrent-state snapshots that vLLM does
not keep for us, one copy of the offered blocks. Fetching, verifying, decoding, encoding and shipping run
on background threads:

- a load writes only into blocks vLLM allocated for the waiting request, and the request is reported in
  ``finished_recving`` once every block was written or reported as failed;
- a finished request's blocks stay allocated until it is reported in ``finished_sending``, which happens
  after the vaults acknowledged (or refused) its blobs. At most ``max_inflight_stores`` stores run and
  ``max_queued_stores`` wait; beyond that a store is dropped and counted (a miss later, never a stall).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from tierkv.client.cluster import Cluster
from tierkv.codec.torch_codec import decode_tensor, encode_tensor
from tierkv.connectors.vllm.layout import KVGroupView, StateGroupView
from tierkv.connectors.vllm.lazy import LazyCluster
from tierkv.connectors.vllm.plan import KV, BlockRef, LoadJob, StepJobs, StoreJob, Stream, Topology
from tierkv.connectors.vllm.stats import Counters
from tierkv.errors import TierKVError
from tierkv.tiering.batches import byte_batches

logger = logging.getLogger(__name__)

MAX_PUT_BYTES = 32 * 1024 * 1024
"""Blobs per put call are capped at this many bytes (well under the vaults' message limits)."""
CHUNK_BLOCKS = 64
"""Blocks copied out of (or fetched into) the KV cache at a time, bounding the memory a transfer holds."""

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
        cluster_factory: Callable[[], Cluster],
        *,
        codec: str = "raw",
        max_inflight_stores: int = 2,
        max_queued_stores: int = 64,
        load_threads: int = 2,
        counters: Counters | None = None,
    ) -> None:
        self.topology = topology
        self.views = dict(views)
        self.namespaces = dict(namespaces)
        self.codec = codec
        self.counters = counters or Counters()
        self.per_block_errors = len(topology.groups) == 1
        self._groups = {g.index: g for g in topology.groups}
        self._cluster = LazyCluster(cluster_factory)
        self._max_pending_stores = max_inflight_stores + max_queued_stores
        self._state = _Transfers()
        self._stores = ThreadPoolExecutor(max_inflight_stores, thread_name_prefix="tierkv-store")
        self._loads = ThreadPoolExecutor(load_threads, thread_name_prefix="tierkv-load")
        self._closed = False

    @property
    def cluster(self) -> Cluster:
        """The vault cluster, created on first use (in the worker process, after fork)."""
        return self._cluster.get()

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

    def take_load_errors(self) -> set[int]:
        """Block ids whose load failed since the last call (single-group models only)."""
        st = self._state
        with st.cond:
            errors, st.error_blocks = st.error_blocks, set()
        return errors

    def shutdown(self) -> None:
        """Let running transfers finish (each bounded by its RPC deadlines), then close the cluster."""
        self._closed = True
        self._loads.shutdown(wait=True, cancel_futures=True)
        self._stores.shutdown(wait=True, cancel_futures=False)
        self._cluster.close()

    # -- stores ------------------------------------------------------------------------------------

    def _admit(self, req_id: str | None) -> bool:
        """Take a place in the store queue, or count the store as dropped (never wait for one).

        ``req_id`` names a request whose blocks vLLM keeps until the store is reported; a refused one
        is reported at once. Snapshots were already copied out and pass ``None``.
        """
        st = self._state
        with st.cond:
            accept = not self._closed and st.queued_stores < self._max_pending_stores
            if accept:
                st.queued_stores += 1
            if req_id is not None:
                (st.stores_pending if accept else st.stores_done).add(req_id)
        if not accept:
            self.counters.add("stores_dropped")
            logger.debug("store queue full: %s is not stored", req_id or "a state snapshot")
        return accept

    def _submit_store(self, job: StoreJob) -> None:
        if self._admit(job.req_id):
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
        finally:
            st = self._state
            with st.cond:
                st.queued_stores -= 1
                if not job.snapshot:
                    st.stores_pending.discard(job.req_id)
                    st.stores_done.add(job.req_id)
                st.cond.notify_all()

    def _store(self, job: StoreJob, copies: dict[Stream, tuple[list[BlockRef], torch.Tensor]] | None) -> None:
        cluster = self.cluster
        tally = dict.fromkeys(("stored_blocks", "stored_bytes", "store_skipped_blocks", "store_failures"), 0)
        for stream, wanted in self._by_stream(job.refs).items():
            view = self.views.get(stream)
            if view is None or not wanted:
                continue
            ns = self.namespaces[stream]
            if copies is not None and stream in copies:
                chunks: Iterable[tuple[list[BlockRef], torch.Tensor]] = [copies[stream]]
            else:
                present = cluster.prefix_lookup(ns, [r.key for r in wanted], role=stream.role)
                tally["store_skipped_blocks"] += present
                chunks = self._gathered(view, wanted[present:])
            for batch in byte_batches(self._encoded(stream, chunks), MAX_PUT_BYTES):
                self._put(cluster, ns, stream, batch, tally)
        for name, value in tally.items():
            self.counters.add(name, value)
        if not job.snapshot:
            self.counters.add("store_requests")

    def _encoded(
        self, stream: Stream, chunks: Iterable[tuple[list[BlockRef], torch.Tensor]]
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, blob)`` of each block, encoded as it is asked for."""
        codec = self.codec if stream.kind == KV else "raw"  # state pages: exact bytes
        for refs, data in chunks:
            for ref, block in zip(refs, data, strict=True):
                blob = encode_tensor(
                    block, codec=codec, tokens=self.topology.block_size, layer_group=stream.layer_group
                )
                yield ref.key, blob

    @staticmethod
    def _put(
        cluster: Cluster, ns: bytes, stream: Stream, batch: dict[bytes, bytes], tally: dict[str, int]
    ) -> None:
        size = sum(map(len, batch.values()))
        acked = cluster.put(ns, batch, role=stream.role)
        tally["stored_blocks"] += acked
        tally["store_failures"] += len(batch) - acked
        tally["stored_bytes"] += size * acked // len(batch)

    @staticmethod
    def _gathered(view: GroupView, refs: list[BlockRef]) -> Iterator[tuple[list[BlockRef], torch.Tensor]]:
        """Copies of the blocks, ``CHUNK_BLOCKS`` at a time: a long request never doubles its KV in memory."""
        for i in range(0, len(refs), CHUNK_BLOCKS):
            chunk = refs[i : i + CHUNK_BLOCKS]
            yield chunk, view.gather([r.block_id for r in chunk])

    # -- loads -------------------------------------------------------------------------------------

    def _guarded_load(self, job: LoadJob) -> None:
        try:
            bad = list(job.refs) if job.broken else self._load(job)
        except Exception:
            logger.exception("load of request %s failed", job.req_id)
            bad = list(job.refs)
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
        cluster = self.cluster
        bad: list[BlockRef] = []
        loaded = nbytes = 0
        for stream, refs in self._by_stream(job.refs).items():
            view = self.views.get(stream)
            if view is None:
                bad.extend(refs)
                continue
            ns = self.namespaces[stream]
            for i in range(0, len(refs), CHUNK_BLOCKS):
                chunk = refs[i : i + CHUNK_BLOCKS]
                n, size = self._load_chunk(cluster, ns, stream, view, chunk, bad, job.req_id)
                loaded += n
                nbytes += size
        self.counters.add("restored_blocks", loaded)
        self.counters.add("restored_bytes", nbytes)
        return bad

    def _load_chunk(
        self,
        cluster: Cluster,
        ns: bytes,
        stream: Stream,
        view: GroupView,
        refs: list[BlockRef],
        bad: list[BlockRef],
        req_id: str,
    ) -> tuple[int, int]:
        """One BatchGet, verified and decoded, written into the cache; failures appended to ``bad``."""
        blobs = cluster.get_buffers(ns, [r.key for r in refs], role=stream.role)
        corrupt: list[bytes] = []
        good_ids: list[int] = []
        # Decoded straight into one buffer: the blocks are copied once more, by the scatter.
        buffer = torch.empty((len(refs), *view.block_shape), dtype=view.dtype, device=view.device)
        nbytes = 0
        for ref, blob in zip(refs, blobs, strict=True):
            if blob is None:
                bad.append(ref)
                continue
            try:
                decode_tensor(
                    blob,
                    out=buffer[len(good_ids)],
                    expect_shape=view.block_shape,
                    expect_tokens=self.topology.block_size,
                    expect_layer_group=stream.layer_group,
                )
            except TierKVError as exc:
                logger.warning("block %s of request %s not restored: %s", ref.position, req_id, exc)
                bad.append(ref)
                corrupt.append(ref.key)
                continue
            good_ids.append(ref.block_id)
            nbytes += len(blob)
        if good_ids:
            view.scatter(good_ids, buffer[: len(good_ids)])
        if corrupt:
            # A blob that fails verification would fail every later restore too: drop it so the next
            # store of this prefix replaces it.
            cluster.delete(ns, corrupt, role=stream.role)
        return len(good_ids), nbytes

    # -- helpers -----------------------------------------------------------------------------------

    def _by_stream(self, refs: Sequence[BlockRef]) -> dict[Stream, list[BlockRef]]:
        out: dict[Stream, list[BlockRef]] = defaultdict(list)
        for ref in refs:
            group = self._groups.get(ref.group)
            if group is None:
                continue
            for stream in group.streams:
                out[stream].append(ref)
        return out


__all__ = ["MAX_PUT_BYTES", "WorkerSide"]
