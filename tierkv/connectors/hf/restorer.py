"""Step 2 of a restore: fetch the planned blocks and build the ``DynamicCache`` the model continues from.

One get for the blocks the hot tier does not cover, decoded by the pipeline straight into their token
range of one tensor behind the hot prefix (no concatenation). If fewer blocks arrive than planned the
plan shrinks to the leading run that verified (for a hybrid model to nothing from the vaults, since its
state snapshot sits at the planned boundary).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tierkv.connectors.hf.blocks import ModelBlocks
from tierkv.connectors.hf.hot import HotEntry
from tierkv.connectors.hf.layout import KV, StateSnapshot, build_cache
from tierkv.connectors.hf.payload import HotPayload
from tierkv.connectors.hf.plan import RestorePlan, plan_restore
from tierkv.connectors.hf.planner import Planned
from tierkv.connectors.hf.stats import GenerationStats
from tierkv.connectors.hf.streams import Streams
from tierkv.retention import BlockMeta
from tierkv.tiering import ColdTier, full_blocks


@dataclass
class RestoredCache:
    """The cache of a restored prefix, the final plan, the snapshots known to hold for it, what the
    vaults are known to hold of it (blocks and snapshot positions) and the retention tags the hot entry
    it came from carried for its blocks."""

    cache: Any
    plan: RestorePlan
    states: dict[int, StateSnapshot]
    cold_blocks: int
    cold_states: set[int]
    meta: list[BlockMeta] | None = None


class Restorer:
    """Turns a :class:`~tierkv.connectors.hf.planner.Planned` restore into a cache."""

    def __init__(
        self,
        model: Any,
        blocks: ModelBlocks,
        streams: Streams,
        tier: ColdTier[torch.Tensor] | None,
        device: torch.device,
    ) -> None:
        self.model = model
        self.blocks = blocks
        self.layout = blocks.layout
        self.block_size = blocks.block_size
        self.streams = streams
        self.tier = tier
        self.device = device

    def restore(self, planned: Planned, stats: GenerationStats) -> RestoredCache:
        plan, state = planned.plan, planned.state
        restored_kv: torch.Tensor | None = None
        if plan.cold_blocks and self.layout.has_kv and self.tier is not None:
            restored_kv, plan = self._fetch_kv(self.tier, planned, stats)
        if plan.cold_blocks == 0:
            state = None
        t = time.perf_counter()
        kv, states = _assemble(planned.entry, plan, restored_kv, state)
        cache = build_cache(self.model, self.layout, kv, states.get(plan.restored))
        stats.inject_s += time.perf_counter() - t
        cold_known, cold_states = self._known(planned, plan, state)
        entry = planned.entry
        meta = None
        if entry is not None and plan.hot_tokens and entry.payload.meta is not None:
            meta = entry.payload.meta[: full_blocks(plan.hot_tokens, self.block_size)]
        return RestoredCache(cache, plan, states, cold_known, cold_states, meta)

    def _fetch_kv(
        self, tier: ColdTier[torch.Tensor], planned: Planned, stats: GenerationStats
    ) -> tuple[torch.Tensor | None, RestorePlan]:
        """One get for the planned blocks, decoded behind the hot prefix; a shorter verified run shrinks
        the plan (back to the whole hot match if it no longer reaches past it)."""
        plan, bs = planned.plan, self.block_size
        prefix = plan.hot_tokens
        kv = self.blocks.kv_buffer(prefix + plan.cold_blocks * bs, self.device)
        got = tier.restore(
            self.streams.kv,
            planned.keys[plan.cold_start : plan.cold_stop],
            self.blocks.kv_expect(self.streams.kv),
            lambda n: kv[:, :, :, prefix + n * bs : prefix + (n + 1) * bs],
            leading_only=True,
        )
        stats.fetched(got)
        if got.leading < plan.cold_blocks:
            if self.layout.has_states:
                # The state snapshot sits at the planned boundary: without every block before it, no restore.
                return None, plan_restore(plan.prompt_len, bs, planned.hot_tokens, 0)
            plan = plan_restore(plan.prompt_len, bs, planned.hot_tokens, plan.cold_start + got.leading)
            if plan.cold_blocks == 0:
                return None, plan
        if prefix and planned.entry is not None:
            t = time.perf_counter()
            _copy_prefix(kv, planned.entry.payload.kv, prefix)
            stats.codec_s += time.perf_counter() - t
        return kv[:, :, :, : plan.restored], plan

    def _known(
        self, planned: Planned, plan: RestorePlan, state: StateSnapshot | None
    ) -> tuple[int, set[int]]:
        """Blocks and snapshot positions of the restored prefix the vaults hold (a later store skips them)."""
        cold_states: set[int] = set()
        cold_known = 0
        entry = planned.entry
        if entry is not None and plan.hot_tokens:
            cold_known = min(entry.payload.cold_blocks, full_blocks(plan.restored, self.block_size))
            cold_states = {p for p in entry.payload.cold_states if p <= plan.restored}
        if plan.cold_blocks:
            # A restore that stopped short met a missing or corrupt (now deleted) block right after it.
            held = planned.lookup_blocks if plan.cold_stop == planned.plan.cold_stop else plan.cold_stop
            cold_known = max(cold_known, held)
            if state is not None:
                cold_states.add(plan.restored)
        return cold_known, cold_states


def _copy_prefix(kv: torch.Tensor, hot: Sequence[KV], tokens: int) -> None:
    """The first ``tokens`` tokens of a hot entry's per-layer KV, into the joined tensor."""
    for layer, (k, v) in zip(kv[:, :, :, :tokens], hot, strict=True):
        layer[0].copy_(k[0, :, :tokens])
        layer[1].copy_(v[0, :, :tokens])


def _assemble(
    entry: HotEntry[HotPayload] | None,
    plan: RestorePlan,
    restored_kv: torch.Tensor | None,
    cold_state: StateSnapshot | None,
) -> tuple[list[KV], dict[int, StateSnapshot]]:
    """Per-layer KV of the restored prefix and the state snapshots known to hold for it.

    ``restored_kv`` (hot prefix and cold blocks in one tensor) is present when the vaults served
    blocks; otherwise the prefix is a view of the hot entry.
    """
    hot_n = plan.hot_tokens
    states: dict[int, StateSnapshot] = {}
    if entry is not None and hot_n:
        states = {p: s for p, s in entry.payload.states.items() if p <= plan.restored}
    if cold_state is not None:
        states[plan.restored] = cold_state
    if plan.restored == 0:
        return [], {}
    if restored_kv is None:
        assert entry is not None
        return [(k[:, :, :hot_n], v[:, :, :hot_n]) for k, v in entry.payload.kv], states
    return [(layer[0].unsqueeze(0), layer[1].unsqueeze(0)) for layer in restored_kv], states


__all__ = ["RestoredCache", "Restorer"]
