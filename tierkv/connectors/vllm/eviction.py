"""Store on eviction (``"store": "eviction"``): ship GPU prefix-cache blocks shortly before vLLM reuses them.

With the default ``"store": "finish"`` every finished request's full blocks are shipped to the vaults,
including the many whose prefix comes back while still in vLLM's GPU prefix cache. With ``"eviction"``
a finished request ships nothing; instead the scheduler-side connector, bound to the GPU ``BlockPool``
(``bind_gpu_block_pool``), ships a cached block only when it is about to be handed out again, the way
vLLM's own ``SimpleCPUOffloadConnector`` does in lazy mode.

What is shipped, when
    - At every scheduler step (``build_connector_meta``) the walk reads the pool's free queue from its
      eviction end (the head, which vLLM allocates from) over ``evict_lookahead`` blocks, counting every
      free block, cached or not, since each one is handed out before the next. A block in that window
      that still carries its prefix-cache hash, whose tierkv key is known and that was not shipped
      before, goes into this step's store job. vLLM's own lazy mode keeps a cursor that moves on every
      step and so eventually ships every cached block; this walk restarts at the head each step so only
      blocks close to reuse are shipped (the ``shipped`` memory makes the rescan cheap).
    - When requests are preempted (``scheduler_output.preempted_req_ids``), the blocks they gave up
      that are still cached and free are shipped in the same step, whatever their queue position:
      preemption means the pool is short and they are the next to go.
    - A finished request ships nothing, but its blocks' keys are remembered (by vLLM block hash) with
      the retention metadata and warm token ids its finish-path store would have carried: an evicted
      block is stored with the same key a later lookup computes and with the same metadata. Blocks whose
      request was never seen finishing or being preempted (none in normal operation) have no key and
      are not shipped. Recurrent-state snapshots are shipped as before (vLLM offers them mid-request).

What is held, when released
    Every shipped block gets one reference (``BlockPool.touch``), which takes it out of the free queue
    so vLLM cannot hand it out while the worker copies it. The reference is dropped
    (``BlockPool.free_blocks``: the block returns to the *tail* of the free queue, still cached) when
    every worker has reported the job done in its worker metadata (acknowledged, refused or failed: a
    store is best effort), when the prefix cache is reset (the bound pool's ``reset_prefix_cache``
    refuses while a job runs, as vLLM refuses any reset while a block is referenced), and at shutdown.
    The engine keeps stepping while a job runs (``has_pending_push_work``). Because the worker copies
    only referenced blocks, a preemption cannot reuse a block mid-copy, so the worker-side
    ``handle_preemptions`` hook (which vLLM's connectors use to flush unreferenced copies) has nothing to
    do here.

Memory
    ``evict_remember`` bounds both the block-hash -> key map and the set of shipped keys (oldest
    forgotten first); a forgotten shipped key may be shipped again, which the worker's prefix check
    turns into a skip when the vaults still hold it.

Counted as ``evict_store_blocks`` (blocks handed to the workers, ``evict_preempt_blocks`` of them for
preemptions), ``evict_releases`` (references dropped; held now = the difference) and
``evict_unknown_blocks`` (cached blocks in the window with no known key).
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tierkv.connectors.vllm.plan import NULL_BLOCK, BlockRef, StoreJob, Topology
from tierkv.connectors.vllm.pool import Pool
from tierkv.connectors.vllm.stats import Counters
from tierkv.retention import BlockMeta

logger = logging.getLogger(__name__)

JOB_PREFIX = "tierkv-evict-"
"""Store jobs of evicted blocks are named ``tierkv-evict-<n>``; vLLM never sees these names."""


@dataclass(frozen=True)
class Known:
    """What a cached GPU block is stored as: its group, position in the request, key and metadata."""

    group: int
    position: int
    key: bytes
    meta: BlockMeta | None


class Bounded(OrderedDict[Any, Any]):
    """An insertion-ordered map that forgets its oldest entries beyond ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


HashOf = Callable[[bytes, int], Any]
"""vLLM's pool hash of a group's block from the request's chained hash (``make_block_hash_with_group_id``)."""


class EvictionStore:
    """The walk over the GPU free queue, the references it holds and the jobs that hold them."""

    def __init__(
        self, topology: Topology, lookahead: int, remember: int, counters: Counters, workers: int = 1
    ) -> None:
        self.topology = topology
        self.lookahead = lookahead
        self.counters = counters
        self.workers = workers
        self._pool: Pool | None = None
        self._known: Bounded = Bounded(remember)
        self._shipped: Bounded = Bounded(remember)
        self._jobs: dict[str, list[int]] = {}
        self._reports: dict[str, int] = {}
        self._ids = itertools.count()
        self._version = 0
        """Bumped whenever what is known or shipped changes (the walk's other input)."""
        self._last_walk: tuple[int, int, int, int] | None = None

    @property
    def held(self) -> int:
        """Blocks referenced now for running jobs."""
        return sum(len(ids) for ids in self._jobs.values())

    @property
    def pending(self) -> bool:
        return bool(self._jobs)

    def bind(self, pool: Pool) -> None:
        """Attach to vLLM's GPU block pool (the connector guards its reset with :meth:`before_reset`)."""
        self._pool = pool

    def before_reset(self) -> bool:
        """A prefix-cache reset waits for running jobs (False: refused); after it nothing is shipped."""
        if self._jobs:
            logger.warning("prefix cache reset refused: %d block(s) are being stored", self.held)
            return False
        self._shipped.clear()
        self._version += 1
        return True

    # -- learning keys -----------------------------------------------------------------------------

    def remember(
        self,
        block_ids: Sequence[Sequence[int]],
        keys: Sequence[bytes],
        meta: Mapping[bytes, BlockMeta] | None,
        num_computed: int,
    ) -> None:
        """A finished request: map the vLLM hash of each of its full computed KV blocks to its key."""
        pool = self._pool
        if pool is None:
            return
        full = min(num_computed // self.topology.block_size, len(keys))
        for group in self.topology.kv_groups:
            ids = block_ids[group.index] if group.index < len(block_ids) else []
            for pos in range(min(full, len(ids))):
                block = pool.blocks[ids[pos]]
                if ids[pos] != NULL_BLOCK and block.block_hash is not None:
                    key = keys[pos]
                    self._known.put(block.block_hash, Known(group.index, pos, key, (meta or {}).get(key)))
                    self._version += 1

    def preempted(
        self,
        block_hashes: Sequence[bytes],
        keys: Sequence[bytes],
        meta: Mapping[bytes, BlockMeta] | None,
        hash_of: HashOf,
    ) -> list[StoreJob]:
        """A preempted request: remember its still cached blocks and ship those that are free now.

        Its blocks were freed in this very step; those already handed out again lost their hash and
        are gone. Only models whose hash block is the connector's block can be found by hash.
        """
        pool = self._pool
        if pool is None or self.topology.hashes_per_block != 1:
            return []
        found: list[Any] = []
        for group in self.topology.kv_groups:
            for pos, (h, key) in enumerate(zip(block_hashes, keys, strict=False)):
                block_hash = hash_of(h, group.index)
                block = pool.cached_block_hash_to_block.get_one_block(block_hash)
                if block is None:
                    continue
                self._known.put(block_hash, Known(group.index, pos, key, (meta or {}).get(key)))
                self._version += 1
                if block.ref_cnt == 0:
                    found.append(block)
        job = self._ship(found)
        if job is not None:
            self.counters.add("evict_preempt_blocks", len(job.refs))
            return [job]
        return []

    # -- the walk ----------------------------------------------------------------------------------

    def walk(self) -> list[StoreJob]:
        """This step's job: unshipped cached blocks within ``lookahead`` of the free queue's head.

        Skipped when nothing it reads changed since the last walk: the free queue (its length and end
        blocks: every allocation pops the head, every free appends at the tail, every hit on a free
        block shortens it) and what is known and shipped. An idle or decode-only step then costs a
        tuple comparison instead of a Python loop over the window.
        """
        pool = self._pool
        if pool is None or self.lookahead <= 0:
            return []
        queue = pool.free_block_queue
        seen = (
            queue.num_free_blocks,
            id(queue.fake_free_list_head.next_free_block),
            id(queue.fake_free_list_tail.prev_free_block),
            self._version,
        )
        if seen == self._last_walk:
            return []
        self._last_walk = seen
        wanted: list[Any] = []
        unknown = 0
        for block in itertools.islice(pool.free_block_queue.iter_blocks_after(None), self.lookahead):
            block_hash = block.block_hash
            if block_hash is None or block.is_null:
                continue
            known = self._known.get(block_hash)
            if known is None:
                unknown += 1
            elif known.key not in self._shipped:
                wanted.append(block)
        self.counters.add("evict_unknown_blocks", unknown)
        job = self._ship(wanted)
        return [job] if job is not None else []

    def _ship(self, blocks: Sequence[Any]) -> StoreJob | None:
        """Reference ``blocks`` and make one held store job of them (None when there is nothing)."""
        pool = self._pool
        refs: list[BlockRef] = []
        meta: dict[bytes, BlockMeta] = {}
        chosen: list[Any] = []
        for block in blocks:
            known = self._known.get(block.block_hash)
            if known is None or known.key in self._shipped:
                continue
            self._shipped.put(known.key, True)
            self._version += 1
            refs.append(BlockRef(known.group, known.position, block.block_id, known.key))
            if known.meta is not None:
                meta[known.key] = known.meta
            chosen.append(block)
        if pool is None or not refs:
            return None
        pool.touch(chosen)
        job_id = f"{JOB_PREFIX}{next(self._ids)}"
        self._jobs[job_id] = [b.block_id for b in chosen]
        self.counters.add("evict_store_blocks", len(refs))
        return StoreJob(job_id, tuple(refs), held=True, meta=meta or None)

    # -- completion --------------------------------------------------------------------------------

    def done(self, reports: Mapping[str, int]) -> int:
        """Workers' completion reports (job -> number of workers); a job every worker finished is
        released. Returns the blocks released."""
        released = 0
        for job_id, count in reports.items():
            if job_id not in self._jobs:
                continue
            total = self._reports.pop(job_id, 0) + count
            if total < self.workers:
                self._reports[job_id] = total
                continue
            released += self._release(job_id)
        return released

    def release_all(self) -> int:
        """Drop every reference (shutdown)."""
        return sum(self._release(job_id) for job_id in list(self._jobs))

    def _release(self, job_id: str) -> int:
        ids = self._jobs.pop(job_id)
        self._reports.pop(job_id, None)
        if self._pool is not None:
            self._pool.free_blocks(self._pool.blocks[b] for b in ids)
        self.counters.add("evict_releases", len(ids))
        return len(ids)


__all__ = ["JOB_PREFIX", "Bounded", "EvictionStore", "HashOf", "Known", "Pool"]
