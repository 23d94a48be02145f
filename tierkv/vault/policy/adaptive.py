"""The ``adaptive`` policy, the vault's default: recency within two parts, which part gives up the victim
learned from the traffic (:mod:`.learning` says how, and what it costs).

Rank: one byte for the part (0 probation, 1 main: the entry was read, or stored again while its key was
remembered) and the clock, so each part is an LRU range of the order index and the store's victim search
starts at the range :meth:`TenantLearning.walk_from` names. Tags: importance ≥ 0.7 starts in main,
≤ 0.3 stays in probation; protected entries are outside the order as under every policy.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from itertools import compress
from operator import itemgetter, not_

from tierkv.vault.policy.base import EntryInfo, Learner
from tierkv.vault.policy.learning import (
    SAMPLE_MASK,
    AdaptiveState,
    Part,
    digest,
    older_part,
)


class TenantLearning(AdaptiveState):
    """One tenant's :class:`AdaptiveState`, answering the store in its terms (a
    :class:`~tierkv.vault.policy.base.Learner`): full keys in, rank prefixes out.

    An eviction is only noted (``evicted`` is a list's ``append``, so no Python frame per victim), and
    the noted keys go into the ghost lists at the next admission or :meth:`settle`, in the order they
    went, so every admission sees the lists exactly as if each had been remembered at once (nothing else
    reads them). Admission and the walk start ask :class:`~.learning.Split` itself."""

    journaled = True
    """Its changes belong to the store's write transactions, which may abort."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._victims: list[tuple[bytes, int, bool]] = []
        self.evicted = self._victims.append

    def admit(self, fkey: bytes, size: int, importance: float) -> bool:
        victims = self._victims
        if victims:  # the evictions noted since the last admission first, as settle() takes them
            self.split.remember_all(victims)
            victims.clear()
        return self.split.admit(digest(fkey), size, importance) is _MAIN

    def settle(self) -> None:
        """Remember the noted evictions now: the write transaction committed."""
        self.split.remember_all(self._victims)
        self._victims.clear()
        self.split.commit()

    def abandon(self) -> None:
        """Forget what the aborted write transaction taught: its evictions did not happen, and its
        admissions' ghost lookups are undone (the store retries it, or the Put fails)."""
        self._victims.clear()
        self.split.rollback()

    def walk_from(self, probation: int, main: int) -> bytes | None:
        if self.lru_lead <= 0 or probation <= 0 or main <= 0:  # as victim_part, without the heads
            return _RANK_HEAD[self.split.arc_part(probation, main)]
        return None  # the LRU shadow leads: the older of the two parts' oldest entries

    def walk_by_heads(self, probation_head: int | None, main_head: int | None) -> bytes:
        return _RANK_HEAD[older_part(probation_head, main_head)]

    def keys(self) -> int:
        return super().keys() + len(self._victims)


class AdaptivePolicy:
    """Leaf-first recency in a probation and a main part, ARC's split learned from ghost lists, and
    miniature simulation to fall back to plain recency where the split does not pay. One learning state
    per tenant (its quota, else the vault's budget)."""

    name = "adaptive"
    uses_meta = False
    """Only proven entries need a retention record (the flag); probation entries are stored bare."""
    leaf_first = True

    def __init__(self) -> None:
        self._states: dict[str, TenantLearning] = {}
        self._lock = threading.Lock()
        """Guards the shadows (``observe`` comes from readers too) and the making of states; the split is
        only touched under the store's write lock."""

    def rank(self, entry: EntryInfo) -> bytes:
        return _RANK.pack(entry.proven, entry.clock)

    def state(self, tenant: str, limit: int) -> TenantLearning:
        """The tenant's learning state (made on first use; a new limit starts it afresh)."""
        found = self._states.get(tenant)
        if found is None or found.budget != limit:
            with self._lock:
                found = self._states[tenant] = TenantLearning(budget=max(1, limit))
        return found

    def learner(self, tenant: str, limit: int) -> Learner:
        return self.state(tenant, limit)

    def observe(self, tenant: str, limit: int, fkeys: Sequence[bytes], size: int, *, read: bool) -> None:
        keyed = [(digest(k), size) for k in compress(fkeys, map(not_, map(_MASKED, map(_LAST, fkeys))))]
        if keyed:
            state = self.state(tenant, limit)
            with self._lock:
                state.observe(keyed, read=read)

    def learning_keys(self) -> int:
        """Keys the learning state holds now, all tenants (ghosts and shadows): its memory, stated."""
        with self._lock:
            return sum(s.keys() for s in self._states.values())


_RANK_HEAD = (b"\x00", b"\x01")
"""A rank's first byte by part (indexed by the part, or by ``proven``)."""
_LAST, _MASKED = itemgetter(-1), SAMPLE_MASK.__and__
"""A key is sampled when its last byte's low bits are zero (:func:`~.learning.sampled`): selected by
iterators in C rather than a test per key in Python, as every key of every Put and read passes."""
_RANK = struct.Struct(">BQ")
"""A rank: the part's byte (``proven``), then the clock; one compiled pack per entry ranked."""
_MAIN = Part.MAIN


__all__ = ["AdaptivePolicy", "TenantLearning"]
