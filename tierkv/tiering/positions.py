"""Where a restore may end, for every hook: whole blocks, the last prompt token, state snapshot points.

- at least one prompt token is always computed (the engine needs logits for the last position), so
  at most ``len(prompt) - 1`` tokens are restored;
- the cold tier holds whole blocks only and is asked for the leading run of blocks it has;
- a hybrid model's recurrent state cannot be cropped, so a restore point must be a position where a
  state snapshot exists; in the cold tier those are block boundaries (every ``stride`` blocks and the
  last one of a prompt), and a hit is claimed only up to the last boundary where both the KV blocks
  and the state snapshot exist.
"""

from __future__ import annotations


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


__all__ = [
    "full_blocks",
    "restore_limit",
    "snapshot_boundaries",
    "snapshot_candidates",
]
