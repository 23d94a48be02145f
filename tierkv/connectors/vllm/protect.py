"""Hot-tier protection: keep the GPU prefix-cache blocks of protected prompt prefixes out of eviction.

vLLM evicts cached blocks in LRU order from its free queue, so a burst of unrelated long prompts pushes
out an agent's system prompt even though every one of its next requests starts with it. The connector is
bound to the scheduler's GPU ``BlockPool`` (``bind_gpu_block_pool``) and, when a request finishes, holds
one reference of its own on some of that request's blocks, the way ``BlockPool.touch`` does for a request
that hits the prefix cache: a block with a reference is not in the free queue and cannot be evicted.

What is held
    The blocks of the request's *leading protected run*: the prompt blocks from position 0 up to the
    first block whose retention class (the request's layout, ``[retention.classes]`` of tierkv.toml) is
    not ``protected``. A protected block behind an unprotected one is not held: the prefix cache can
    only reach it through its predecessors. Only blocks still in the prefix cache (hashed, not the null
    block) are held, at most one tierkv reference per block however many requests share it, of every
    KV-cache group of the request. A block already held is refreshed (it becomes the newest).

How much
    At most ``gpu_protect_fraction`` of the pool's blocks (0 turns protection off). When the cap is
    reached a new block displaces the held block that comes first in release order, if it ranks above
    it; otherwise it is not held (``gpu_protect_skipped``). Nothing new is held while the pool's free
    blocks are below the watermark.

When it is released (the reference is dropped with ``BlockPool.free_blocks``: a block nobody else uses
goes back to the tail of the free queue and normal LRU eviction applies again)
    - every scheduler step (``build_connector_meta``), while the free blocks are below
      ``gpu_protect_watermark`` of the pool: held blocks that no request uses, in release order, until
      the free blocks are back at the watermark;
    - when vLLM cannot allocate blocks for a running request and is about to preempt one
      (``has_pending_block_frees``): every held block no request uses, so held blocks never cause a
      preemption (vLLM then retries the request in the next step);
    - when the prefix cache is reset (vLLM refuses a reset while any block has a reference, so the
      bound pool's ``reset_prefix_cache`` releases everything first) and at shutdown: everything.

    Release order: lowest importance first, then the least recently protected, then the deepest block
    of a chain first (its head stays useful without its tail, not the reverse). A held block that a
    running request also uses is never released for pressure: freeing it would return no memory.

Counted as ``gpu_protect_holds`` / ``gpu_protect_releases`` (held now = holds - releases, also the
``tierkv_connector_gpu_protect_held_blocks`` gauge), ``gpu_protect_pressure_releases`` (the releases
caused by the watermark or an allocation failure) and ``gpu_protect_skipped``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tierkv.connectors.vllm.pool import Pool
from tierkv.connectors.vllm.stats import Counters
from tierkv.retention import BlockMeta, Chunk, Retention, tag_blocks

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A block a finished request offers for holding: its id, importance and depth in the chain."""

    block_id: int
    importance: float
    depth: int


def leading_protected(metas: Sequence[BlockMeta]) -> list[float]:
    """Importances of the leading run of protected blocks (stops at the first unprotected block)."""
    return [m.importance for m in itertools.takewhile(lambda m: m.protected, metas)]


def candidates(
    block_ids: Sequence[Sequence[int]],
    group_block_sizes: Sequence[int],
    run: Sequence[float],
    block_size: int,
) -> list[Candidate]:
    """The blocks of every group that lie wholly inside the protected run of ``run`` blocks of
    ``block_size`` tokens; each takes the lowest importance of the run blocks it covers."""
    tokens = len(run) * block_size
    out: list[Candidate] = []
    for ids, size in zip(block_ids, group_block_sizes, strict=False):
        for depth, block_id in enumerate(ids[: tokens // size]):
            first, last = depth * size // block_size, ((depth + 1) * size - 1) // block_size
            out.append(Candidate(block_id, min(run[first : last + 1]), depth))
    return out


def request_candidates(
    chunks: Sequence[Chunk] | None,
    prompt_tokens: int,
    block_ids: Sequence[Sequence[int]],
    group_block_sizes: Sequence[int],
    block_size: int,
    retention: Retention,
) -> list[Candidate]:
    """What a finished request offers: its prompt's leading protected run under its layout."""
    if not chunks:
        return []
    run = leading_protected(tag_blocks(chunks, prompt_tokens // block_size, block_size, retention))
    return candidates(block_ids, group_block_sizes, run, block_size) if run else []


@dataclass
class _Held:
    rank: tuple[float, int, int]
    version: int


class GpuProtector:
    """Holds and releases tierkv's references on GPU blocks; see the module docstring for the rules."""

    def __init__(self, fraction: float, watermark: float, counters: Counters) -> None:
        self.fraction = fraction
        self.watermark = watermark
        self.counters = counters
        self._pool: Pool | None = None
        self._held: dict[int, _Held] = {}
        self._heap: list[tuple[tuple[float, int, int], int, int]] = []
        self._seq = itertools.count()
        self._versions = itertools.count()

    @property
    def enabled(self) -> bool:
        return self._pool is not None and self.cap > 0

    @property
    def cap(self) -> int:
        """Most blocks held at once."""
        return int(self.fraction * self._pool.num_gpu_blocks) if self._pool is not None else 0

    @property
    def low_water(self) -> int:
        """Free blocks below which held blocks are released."""
        return math.ceil(self.watermark * self._pool.num_gpu_blocks) if self._pool is not None else 0

    @property
    def held(self) -> int:
        return len(self._held)

    def held_ids(self) -> set[int]:
        return set(self._held)

    def bind(self, pool: Pool) -> None:
        """Attach to vLLM's GPU block pool (the connector guards its reset with :meth:`before_reset`)."""
        self._pool = pool

    def before_reset(self) -> bool:
        """A prefix-cache reset releases every hold first instead of failing on them."""
        self.release_all()
        return True

    def protect(self, offered: Iterable[Candidate]) -> int:
        """Hold (or refresh) the offered blocks, within the cap; returns the number newly held."""
        pool = self._pool
        if pool is None or self.cap <= 0:
            return 0
        offered = list(offered)
        if pool.get_num_free_blocks() < self.low_water:
            self.counters.add("gpu_protect_skipped", len(offered))
            return 0
        seq = next(self._seq)
        added = skipped = 0
        for c in offered:
            block = pool.blocks[c.block_id]
            if block.is_null or block.block_hash is None:
                continue
            rank = (c.importance, seq, -c.depth)
            if c.block_id in self._held:
                self._push(c.block_id, max(rank, self._held[c.block_id].rank))
            elif self._room_for(rank):
                pool.touch([block])
                self._push(c.block_id, rank)
                added += 1
            else:
                skipped += 1
        self.counters.add("gpu_protect_holds", added)
        self.counters.add("gpu_protect_skipped", skipped)
        return added

    def _room_for(self, rank: tuple[float, int, int]) -> bool:
        """True when a block of ``rank`` may be held, displacing the first in release order if full."""
        if len(self._held) < self.cap:
            return True
        first = self._peek()
        if first is None or self._held[first].rank >= rank:
            return False
        self._release([first], pressure=False)
        return True

    def relieve(self) -> int:
        """The per-step check: release idle held blocks until the free blocks reach the watermark."""
        pool = self._pool
        if pool is None or not self._held:
            return 0
        short = self.low_water - pool.get_num_free_blocks()
        return self._release(self._idle_in_order(short), pressure=True) if short > 0 else 0

    def make_room(self) -> bool:
        """vLLM is about to preempt for lack of blocks: release every idle held block. True if any."""
        if self._pool is None or not self._held:
            return False
        return self._release(self._idle_in_order(len(self._held)), pressure=True) > 0

    def release_all(self) -> int:
        """Drop every hold (prefix-cache reset, shutdown)."""
        return self._release(list(self._held), pressure=False)

    def _idle_in_order(self, limit: int) -> list[int]:
        """Up to ``limit`` held blocks that only tierkv references, in release order."""
        assert self._pool is not None
        blocks = self._pool.blocks
        ordered = sorted(self._held, key=lambda b: self._held[b].rank)
        return [b for b in ordered if blocks[b].ref_cnt == 1][:limit]

    def _release(self, block_ids: Sequence[int], *, pressure: bool) -> int:
        if not block_ids or self._pool is None:
            return 0
        for b in block_ids:
            del self._held[b]
        self._pool.free_blocks(self._pool.blocks[b] for b in block_ids)
        self.counters.add("gpu_protect_releases", len(block_ids))
        if pressure:
            self.counters.add("gpu_protect_pressure_releases", len(block_ids))
        if len(self._heap) > 2 * len(self._held) + 64:
            self._heap = [(h.rank, b, h.version) for b, h in self._held.items()]
            heapq.heapify(self._heap)
        return len(block_ids)

    def _push(self, block_id: int, rank: tuple[float, int, int]) -> None:
        version = next(self._versions)
        self._held[block_id] = _Held(rank, version)
        heapq.heappush(self._heap, (rank, block_id, version))

    def _peek(self) -> int | None:
        """The held block that comes first in release order (stale heap entries are dropped)."""
        while self._heap:
            _, block_id, version = self._heap[0]
            entry = self._held.get(block_id)
            if entry is not None and entry.version == version:
                return block_id
            heapq.heappop(self._heap)
        return None


__all__ = [
    "Candidate",
    "GpuProtector",
    "Pool",
    "candidates",
    "leading_protected",
    "request_candidates",
]
