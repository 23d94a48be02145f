"""What every eviction policy is to the store: a rank per entry, and optionally what it learns.

A policy maps an entry to a sortable rank (bytes). The store keeps one LMDB index ordered by rank per
tenant and, when it must free space, evicts from the lowest rank upwards inside the same write transaction
that needs the room, so the budget holds at every commit. Ranks are recomputed when an entry is written or
read. The clock is a logical counter persisted with the data (never wall time), so a jumping system clock
cannot reorder evictions.

A :class:`LearningPolicy` also learns from the traffic (queues, ghost lists, admission): the store tells
each tenant's :class:`Learner` what is admitted and evicted and asks it where in the order the victim
search starts, and tells the policy what is read and stored. Its state
lives in memory, bounded, and may be lost at a restart: what an entry earned is kept with the entry
(``proven``), so the order itself survives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from tierkv.retention.classes import NEUTRAL_IMPORTANCE


class EntryInfo(NamedTuple):
    """What a policy may look at when ranking an entry. ``population`` is how many entries the store held
    when the entry was last updated (``context`` measures age in turnovers of that many events);
    ``proven``: the entry was read, or admitted as a remembered key (``adaptive``'s main part).

    A named tuple rather than a frozen dataclass: one is made for every entry written or evicted, and a
    tuple is the cheapest immutable record to make."""

    clock: int
    size: int
    priority: int = 0
    importance: float = NEUTRAL_IMPORTANCE
    hits: float = 0.0
    sharing: int = 0
    population: int = 1
    proven: bool = False


class EvictionPolicy(Protocol):
    """Ranks entries: the lowest rank is evicted first. Ranks must be fixed-length for one policy.
    ``uses_meta``: the rank reads importance, hits, sharing or ``proven`` (so the store keeps a retention
    record for every entry)."""

    name: str
    uses_meta: bool

    def rank(self, entry: EntryInfo) -> bytes: ...


class Learner(Protocol):
    """One tenant's learning (the tenant's bytes are its quota, else the vault's budget), as the store
    talks to it inside a Put's write transaction, under the store's write lock. The store asks its policy
    for each tenant's learner once and keeps it: these calls come once or more per stored block, so they
    take the store's own terms (full keys, bytes per part) and nothing that must be built per call."""

    @property
    def evicted(self) -> Callable[[tuple[bytes, int, bool]], object]:
        """Told (full key, charge, proven) of each entry evicted (not deleted), to remember its key: a
        callable the store calls once per victim, so a note (a list's ``append``, no Python frame) rather
        than a method; the learner takes the notes in before its next admission, or at :meth:`settle`."""

    def admit(self, fkey: bytes, size: int, importance: float) -> bool:
        """Whether an entry stored now (its key not held) starts proven."""

    def settle(self) -> None:
        """The write transaction the learner was told of committed: take in what :attr:`evicted` noted
        (the store calls this once per transaction that admitted or evicted, so the notes stay bounded by
        one transaction's)."""

    def abandon(self) -> None:
        """That transaction aborted: forget its notes and undo what its admissions learned, so that the
        learner never holds what did not happen (the store retries the write, or the Put fails)."""

    def walk_from(self, probation: int, main: int) -> bytes | None:
        """The order-key prefix the victim search starts at, given the bytes in each part (committed or in
        this transaction); None when that depends on the parts' oldest entries: the store then asks
        :meth:`walk_by_heads` (finding them costs two cursor seeks, so only then)."""

    def walk_by_heads(self, probation_head: int | None, main_head: int | None) -> bytes:
        """The walk start, given the clocks of the oldest entry not proven and the oldest proven one
        (None: there is none)."""


class LearningPolicy(EvictionPolicy, Protocol):
    """A policy that learns. Every call is bounded work; ``observe`` comes from readers too."""

    leaf_first: bool
    """Stamp a batch deepest block first (the store reverses a chain's order), so eviction trims chains
    from their ends."""

    def learner(self, tenant: str, limit: int) -> Learner:
        """The tenant's learning state (``limit``: the tenant's bytes), made on first use."""

    def observe(self, tenant: str, limit: int, fkeys: Sequence[bytes], size: int, *, read: bool) -> None:
        """A batch read or stored, in chain order (``size``: the entries' typical charge)."""


__all__ = ["EntryInfo", "EvictionPolicy", "Learner", "LearningPolicy"]
