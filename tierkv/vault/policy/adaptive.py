"""The ``adaptive`` policy, the vault's default: recency within two parts, which part gives up the victim
learned from the traffic (:mod:`.learning` says how, and what it costs).

Rank: one byte for the part (0 probation, 1 main: the entry was read, or stored again while its key was
remembered) and the clock, so each part is an LRU range of the order index and the store's victim search
starts at the range :meth:`AdaptivePolicy.walk_from` names. Tags: importance ≥ 0.7 starts in main,
≤ 0.3 stays in probation; protected entries are outside the order as under every policy.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tierkv.vault.policy.base import Budget, EntryInfo
from tierkv.vault.policy.learning import AdaptiveState, Part, digest


class AdaptivePolicy:
    """Leaf-first recency in a probation and a main part, ARC's split learned from ghost lists, and
    miniature simulation to fall back to plain recency where the split does not pay. One learning state
    per tenant (its quota, else the vault's budget)."""

    name = "adaptive"
    uses_meta = True
    leaf_first = True

    def __init__(self) -> None:
        self._states: dict[str, AdaptiveState] = {}
        self._lock = threading.Lock()

    def rank(self, entry: EntryInfo) -> bytes:
        part = Part.MAIN if entry.proven else Part.PROBATION
        return bytes((part,)) + entry.clock.to_bytes(8, "big")

    def state(self, budget: Budget) -> AdaptiveState:
        """The tenant's learning state (made on first use; a new limit starts it afresh)."""
        found = self._states.get(budget.tenant)
        if found is None or found.budget != budget.limit:
            found = self._states[budget.tenant] = AdaptiveState(budget=max(1, budget.limit))
        return found

    def admit(self, budget: Budget, fkey: bytes, size: int, importance: float) -> bool:
        with self._lock:
            return self.state(budget).split.admit(digest(fkey), size, importance) is Part.MAIN

    def evicted(self, budget: Budget, fkey: bytes, size: int, proven: bool) -> None:
        with self._lock:
            part = Part.MAIN if proven else Part.PROBATION
            self.state(budget).split.remember(part, digest(fkey), size)

    def observe(self, budget: Budget, fkeys: Sequence[bytes], size: int, *, read: bool) -> None:
        with self._lock:
            self.state(budget).observe([(digest(k), size) for k in fkeys], read=read)

    def walk_from(self, budget: Budget, heads: tuple[int | None, int | None]) -> bytes:
        with self._lock:
            part = self.state(budget).victim_part(budget.probation, budget.main, heads)
        return bytes((part,))

    def learning_keys(self) -> int:
        """Keys the learning state holds now, all tenants (ghosts and shadows): its memory, stated."""
        with self._lock:
            return sum(s.keys() for s in self._states.values())


__all__ = ["AdaptivePolicy"]
