"""Restore planning: how much of a prompt to take from the hot tier, the cold tier, or neither.

Rules, in the order they are applied:

- at least one prompt token is always computed (the engine needs logits for the last position), so
  at most ``len(prompt) - 1`` tokens are restored;
- the cold tier holds whole blocks only and is asked for the leading run of blocks it has;
- a hybrid model's recurrent state cannot be cropped, so a restore point must be a position where a
  state snapshot exists; on the cold tier those are block boundaries, and the hit is claimed only up
  to the last boundary where both the KV blocks and the state snapshot exist;
- the hot tier wins ties (no network); when the cold tier reaches further, the hot entry still serves
  the blocks it covers and only the remaining blocks are fetched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


def restore_limit(prompt_len: int) -> int:
    """The most tokens a restore may cover: all but the last prompt token."""
    return max(prompt_len - 1, 0)


def full_blocks(tokens: int, block_size: int) -> int:
    """Number of whole blocks inside ``tokens`` tokens."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    return max(tokens, 0) // block_size


def snapshot_boundaries(start: int, stop: int, block_size: int, stride_blocks: int) -> list[int]:
    """Token positions in ``(start, stop]`` where a hybrid model's state is snapshotted.

    Every ``stride_blocks``-th block boundary, plus the last block boundary at or before ``stop`` (the
    point a returning identical prompt restores to).
    """
    if stride_blocks < 1:
        raise ValueError("stride_blocks must be >= 1")
    step = stride_blocks * block_size
    points = set(range((start // step + 1) * step, stop + 1, step))
    last = full_blocks(stop, block_size) * block_size
    if last > start:
        points.add(last)
    return sorted(points)


def snapshot_candidates(blocks: int, stride_blocks: int, limit: int = 2) -> list[int]:
    """Block counts, best first, at which a stored state snapshot may exist below ``blocks`` + 1.

    ``blocks`` itself (the final boundary of a stored prompt) and then the stride multiples below it.
    """
    out: list[int] = []
    if blocks >= 1:
        out.append(blocks)
    m = (blocks - 1) // stride_blocks * stride_blocks if blocks > 1 else 0
    while m >= 1 and len(out) < limit:
        out.append(m)
        m -= stride_blocks
    return out


@dataclass(frozen=True)
class RestorePlan:
    """Which tokens of a prompt come from where.

    Tokens ``[0, hot_tokens)`` come from the hot entry, blocks ``[cold_start, cold_stop)`` from the
    vaults; ``restored`` is the total, ``computed`` what the engine still has to prefill.
    """

    prompt_len: int
    block_size: int
    hot_tokens: int = 0
    cold_start: int = 0
    cold_stop: int = 0

    @property
    def cold_blocks(self) -> int:
        return self.cold_stop - self.cold_start

    @property
    def cold_tokens(self) -> int:
        return self.cold_blocks * self.block_size

    @property
    def restored(self) -> int:
        return self.cold_stop * self.block_size if self.cold_blocks else self.hot_tokens

    @property
    def computed(self) -> int:
        return self.prompt_len - self.restored

    @property
    def source(self) -> str:
        if self.cold_blocks and self.hot_tokens:
            return "hot+cold"
        if self.cold_blocks:
            return "cold"
        return "hot" if self.hot_tokens else "none"


def plan_restore(prompt_len: int, block_size: int, hot_tokens: int, cold_blocks: int) -> RestorePlan:
    """Combine a hot-tier match of ``hot_tokens`` and ``cold_blocks`` leading blocks in the vaults.

    Both inputs must already respect the model's restore points (see ``snapshot_candidates``). The
    cold tier is used only when it reaches further than the hot tier; the hot entry then supplies
    the whole blocks it covers.
    """
    limit = restore_limit(prompt_len)
    hot = min(hot_tokens, limit)
    cold = min(cold_blocks, full_blocks(limit, block_size))
    if cold * block_size <= hot:
        return RestorePlan(prompt_len, block_size, hot_tokens=hot)
    start = full_blocks(hot, block_size)
    return RestorePlan(
        prompt_len, block_size, hot_tokens=start * block_size, cold_start=start, cold_stop=cold
    )


__all__ = [
    "RestorePlan",
    "full_blocks",
    "plan_restore",
    "restore_limit",
    "snapshot_boundaries",
    "snapshot_candidates",
]
