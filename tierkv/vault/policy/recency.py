"""Recency policies: ``lru`` and ``priority-lru``."""

from __future__ import annotations

from tierkv.vault.policy.base import EntryInfo


class LRUPolicy:
    """Least recently used (by put or get), using the store's logical clock."""

    name = "lru"
    uses_meta = False

    def rank(self, entry: EntryInfo) -> bytes:
        return entry.clock.to_bytes(8, "big")


class PriorityLRUPolicy:
    """Lower priority is evicted first; within one priority, least recently used goes first."""

    name = "priority-lru"
    uses_meta = False

    def rank(self, entry: EntryInfo) -> bytes:
        return min(entry.priority, 0xFFFF).to_bytes(2, "big") + entry.clock.to_bytes(8, "big")


__all__ = ["LRUPolicy", "PriorityLRUPolicy"]
