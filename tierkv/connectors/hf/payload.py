"""What a hot entry of the transformers hook holds, and what it knows the vaults already have."""

from __future__ import annotations

from dataclasses import dataclass, field

from tierkv.connectors.hf.layout import KV, StateSnapshot, kv_nbytes


@dataclass
class HotPayload:
    """KV of every attention layer, state snapshots by position, and the blocks / snapshot positions
    the vaults already hold (a store-on-evict skips them)."""

    kv: list[KV]
    states: dict[int, StateSnapshot] = field(default_factory=dict)
    cold_blocks: int = 0
    cold_states: set[int] = field(default_factory=set)

    def nbytes(self) -> int:
        return kv_nbytes(self.kv) + sum(s.nbytes for s in self.states.values())

    def merge(self, old: HotPayload) -> None:
        """Take over what a superseded entry (a prefix of this one) knew."""
        for pos, snap in old.states.items():
            self.states.setdefault(pos, snap)
        self.cold_blocks = max(self.cold_blocks, old.cold_blocks)
        self.cold_states |= old.cold_states


__all__ = ["HotPayload"]
