"""The transformers hook's restore plan: how much of a prompt comes from the hot tier, the vaults, or none.

The hot tier wins ties (no network); when the vaults reach further, the hot entry still serves the
blocks it covers and only the remaining blocks are fetched. The limits every hook shares (the last
prompt token, whole blocks, state snapshot points) are in :mod:`tierkv.tiering.positions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierkv.tiering.positions import full_blocks, restore_limit


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


__all__ = ["RestorePlan", "plan_restore"]
