"""Recurrent-state snapshots of a hybrid model while it computes: at block boundaries, during prefill and
(when decoding matches prefill) during generation.

A recurrent state cannot be cropped, so a restore can only resume where a snapshot exists; the
boundaries are :func:`tierkv.tiering.snapshot_boundaries` (every ``stride`` blocks plus the prompt's last
block boundary), the ones the vaults can serve.
"""

from __future__ import annotations

from typing import Any

import torch

from tierkv.connectors.hf.layout import CacheLayout, StateSnapshot, cache_kwargs, extract_kv, snapshot_states
from tierkv.tiering import restore_limit, snapshot_boundaries


class Snapshotter:
    """Runs the prompt up to each snapshot boundary and snapshots the state there (and while decoding)."""

    def __init__(
        self, model: Any, layout: CacheLayout, block_size: int, stride_blocks: int, device: torch.device
    ) -> None:
        self.model = model
        self.layout = layout
        self.block_size = block_size
        self.stride_blocks = stride_blocks
        self.device = device

    def prefill(self, ids: torch.Tensor, cache: Any, restored: int, states: dict[int, StateSnapshot]) -> None:
        """Run the prompt up to each snapshot boundary and clone the recurrent state there.

        Besides the block boundaries (which the vaults can serve) the state is also snapshotted after
        ``len(prompt) - 1`` tokens, so the hot tier can serve the same prompt again with one token
        left to compute.
        """
        limit = restore_limit(ids.shape[1])
        boundaries = snapshot_boundaries(restored, limit, self.block_size, self.stride_blocks)
        if limit > max([restored, *boundaries]):
            boundaries.append(limit)
        pos = restored
        with torch.no_grad():
            for boundary in boundaries:
                self.model(
                    input_ids=ids[:, pos:boundary],
                    use_cache=True,
                    **cache_kwargs(self.model, cache),
                    attention_mask=torch.ones((1, boundary), dtype=torch.long, device=self.device),
                    position_ids=torch.arange(pos, boundary, device=self.device).unsqueeze(0),
                    logits_to_keep=1,
                )
                states[boundary] = snapshot_states(self.layout, cache)
                pos = boundary

    def while_decoding(
        self, cache: Any, states: dict[int, StateSnapshot], prompt_len: int, position: int
    ) -> None:
        """Snapshot the recurrent state at block boundaries reached while generating.

        Of the boundaries inside the reply only stride multiples and the latest are kept: the latest
        is where a follow-up turn (prompt + this reply + more) can be restored from the vaults. A
        snapshot is taken only when the attention KV confirms the cache covers ``position`` tokens.
        """
        if position % self.block_size or position in states:
            return
        if self.layout.has_kv and extract_kv(self.layout, cache)[0][0].shape[2] != position:
            return
        step = self.block_size * self.stride_blocks
        for old in [p for p in states if p >= prompt_len and p % step]:
            del states[old]
        states[position] = snapshot_states(self.layout, cache)


__all__ = ["Snapshotter"]
