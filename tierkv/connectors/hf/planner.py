"""Step 1 of a restore: how far the hot tier and the vaults reach for a prompt.

The hot tier's longest usable prefix is found in process; only if the vaults could reach further is
``kv_cold`` asked for its leading run of blocks (one prefix lookup) and, for a hybrid model, ``ssm_cold``
for the state snapshot at the furthest candidate boundary (a get per candidate, verified by the
pipeline). The result says which tokens come from where (:class:`~tierkv.connectors.hf.plan.RestorePlan`)
and carries what the restorer needs next.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tierkv.connectors.hf.blocks import ModelBlocks
from tierkv.connectors.hf.hot import HotEntry, HotTier, TokenArray
from tierkv.connectors.hf.layout import StateSnapshot
from tierkv.connectors.hf.payload import HotPayload
from tierkv.connectors.hf.plan import RestorePlan, plan_restore
from tierkv.connectors.hf.stats import GenerationStats
from tierkv.connectors.hf.streams import Streams
from tierkv.tiering import ColdTier, full_blocks, restore_limit, snapshot_candidates


@dataclass
class Planned:
    """A plan and what it rests on.

    ``hot_tokens`` is the whole usable hot match (what is left if the vaults fail to deliver),
    ``keys`` the KV block keys up to the restore limit, ``lookup_blocks`` the leading blocks the vaults
    said they hold and ``state`` the verified snapshot at ``plan.restored`` when the vaults serve it.
    """

    plan: RestorePlan
    entry: HotEntry[HotPayload] | None
    hot_tokens: int
    keys: list[bytes]
    lookup_blocks: int
    state: StateSnapshot | None


class RestorePlanner:
    """Plans restores against one session's hot tier and (if any) its vaults."""

    def __init__(
        self,
        blocks: ModelBlocks,
        streams: Streams,
        hot: HotTier[HotPayload],
        tier: ColdTier[torch.Tensor] | None,
        stride_blocks: int,
        device: torch.device,
    ) -> None:
        self.blocks = blocks
        self.layout = blocks.layout
        self.block_size = blocks.block_size
        self.streams = streams
        self.hot = hot
        self.tier = tier
        self.stride_blocks = stride_blocks
        self.device = device

    def plan(self, tokens: TokenArray, stats: GenerationStats) -> Planned:
        t = time.perf_counter()
        limit = restore_limit(len(tokens))
        entry, hot_n = self.hot.longest_prefix(tokens, usable=self._hot_usable(limit))
        max_blocks = full_blocks(limit, self.block_size)
        stats.plan_s = time.perf_counter() - t
        keys: list[bytes] = []
        lookup_n = cold_n = 0
        state: StateSnapshot | None = None
        if self.tier is not None and max_blocks * self.block_size > hot_n:
            keys = self.streams.kv_keys(tokens, max_blocks)
            lookup_n = cold_n = self._lookup(self.tier, keys, stats)
            if self.layout.has_states and cold_n * self.block_size > hot_n:
                cold_n, state = self._fetch_state(self.tier, tokens, cold_n, hot_n, stats)
        plan = plan_restore(len(tokens), self.block_size, hot_n, cold_n)
        return Planned(plan, entry, hot_n, keys, lookup_n, state)

    def _hot_usable(self, limit: int) -> Callable[[HotEntry[HotPayload], int], int]:
        """How much of a hot match is usable: a hybrid model only up to a stored state snapshot."""

        def usable(entry: HotEntry[HotPayload], lcp: int) -> int:
            n = min(lcp, limit)
            if not self.layout.has_states:
                return n
            return max((p for p in entry.payload.states if p <= n), default=0)

        return usable

    def _lookup(self, tier: ColdTier[torch.Tensor], keys: list[bytes], stats: GenerationStats) -> int:
        if not self.layout.has_kv:  # a pure-state model: only the snapshot decides
            return len(keys)
        t = time.perf_counter()
        found = tier.lookup(self.streams.kv, keys)
        stats.network_s += time.perf_counter() - t
        return found

    def _fetch_state(
        self,
        tier: ColdTier[torch.Tensor],
        tokens: TokenArray,
        kv_blocks: int,
        hot_n: int,
        stats: GenerationStats,
    ) -> tuple[int, StateSnapshot | None]:
        """The furthest candidate boundary whose state snapshot is in the vaults and verifies."""
        limit_blocks = min(kv_blocks, full_blocks(restore_limit(len(tokens)), self.block_size))
        candidates = [
            b for b in snapshot_candidates(limit_blocks, self.stride_blocks) if b * self.block_size > hot_n
        ]
        if not candidates:
            return 0, None
        group_keys = self.streams.state_keys(tokens, candidates[0])
        for b in candidates:
            position = b * self.block_size
            flats = self.blocks.state_buffers(self.device)
            got = tier.restore(
                self.streams.state,
                [group_keys[g][b - 1] for g in self.streams.state_groups],
                self.blocks.state_expects(self.streams.state, position),
                flats.__getitem__,
                leading_only=True,
            )
            stats.fetched(got)
            if got.leading == len(flats):
                return b, self.blocks.snapshot(flats)
        return 0, None


__all__ = ["Planned", "RestorePlanner"]
