"""Eviction policy: decides *what* goes when the store needs room; the store only moves bytes.

A policy maps an entry to a sortable rank (bytes). The store keeps one LMDB index ordered by rank and,
when it must free space, evicts from the lowest rank upwards inside the same write transaction that needs
the room. Ranks are recomputed when an entry is written or read, so recency-style policies need nothing
more than this one method, and priority-aware policies put the priority in front of the clock.

The clock is a logical counter persisted with the data (never wall time), so a jumping system clock cannot
reorder evictions.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True, slots=True)
class EntryInfo:
    """What a policy may look at when ranking an entry."""

    clock: int
    size: int
    priority: int = 0


class EvictionPolicy(Protocol):
    """Ranks entries: the lowest rank is evicted first. Ranks must be fixed-length for one policy."""

    name: str

    def rank(self, entry: EntryInfo) -> bytes: ...


class LRUPolicy:
    """Least recently used (by put or get), using the store's logical clock."""

    name = "lru"

    def rank(self, entry: EntryInfo) -> bytes:
        return entry.clock.to_bytes(8, "big")


class PriorityLRUPolicy:
    """Lower priority is evicted first; within one priority, least recently used goes first."""

    name = "priority-lru"

    def rank(self, entry: EntryInfo) -> bytes:
        return min(entry.priority, 0xFFFF).to_bytes(2, "big") + entry.clock.to_bytes(8, "big")


POLICIES: dict[str, type[LRUPolicy] | type[PriorityLRUPolicy]] = {
    LRUPolicy.name: LRUPolicy,
    PriorityLRUPolicy.name: PriorityLRUPolicy,
}


def make_policy(name: str) -> EvictionPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r} (known: {', '.join(POLICIES)})") from None
