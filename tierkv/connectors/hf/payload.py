"""What a hot entry of the transformers hook holds, and what it knows the vaults already have."""

from __future__ import annotations

from dataclasses import dataclass, field

from tierkv.connectors.hf.layout import KV, StateSnapshot, kv_nbytes
from tierkv.retention import BlockMeta


@dataclass
class HotPayload:
    """KV of every attention layer, state snapshots by position, and the blocks / snapshot positions
    the vaults already hold (a store-on-evict skips them).

    ``meta`` is the retention metadata of each full block when the request came with a layout (None:
    it did not, and its blocks are stored untagged); it stays with the entry until the store ships it.
    """

    kv: list[KV]
    states: dict[int, StateSnapshot] = field(default_factory=dict)
    cold_blocks: int = 0
    cold_states: set[int] = field(default_factory=set)
    meta: list[BlockMeta] | None = None

    def nbytes(self) -> int:
        return kv_nbytes(self.kv) + sum(s.nbytes for s in self.states.values())

    def merge(self, old: HotPayload) -> None:
        """Take over what a superseded entry (a prefix of this one) knew."""
        for pos, snap in old.states.items():
            self.states.setdefault(pos, snap)
        self.cold_blocks = max(self.cold_blocks, old.cold_blocks)
        self.cold_states |= old.cold_states
        self.meta = merge_meta(self.meta, old.meta)


def merge_meta(new: list[BlockMeta] | None, old: list[BlockMeta] | None) -> list[BlockMeta] | None:
    """Per block, the newer request's tag, or the older one's where the newer left the block untagged.

    A request that reuses a tagged prefix without a layout of its own keeps the prefix's tags: storing
    it again untagged would strip them in the vaults.
    """
    if new is None or old is None:
        return new if old is None else list(old)
    head = [n if n.tagged else o for n, o in zip(new, old, strict=False)]
    return head + new[len(head) :] + old[len(head) :]


__all__ = ["HotPayload", "merge_meta"]
