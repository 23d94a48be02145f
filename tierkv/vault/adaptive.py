"""The ``adaptive`` policy's learning state: how much room new blocks get before they prove themselves.

Most KV blocks a vault stores are never read again (a quarter are, on public production traces), and
the ones that are come back soon. Plain LRU gives every new block the same standing as a block read ten
times. ``adaptive`` is ARC (Megiddo & Modha, 2003) in bytes, with longer memory:

- A new block enters **probation**. A block read from the vault, or stored again soon after it was
  evicted (its key is in a *ghost* list), is in **main**. Each part is LRU.
- When room is needed, probation gives up its least recent block while it holds more than its
  **target** bytes, else main does. An evicted key is remembered (keys only) in the ghost list of the
  part it left.
- The target learns from misses: a block stored again while remembered from probation says probation was
  too small (target grows by its size, more when the other ghost list is longer); one remembered from main
  says main was (target shrinks). No setting: the split follows the traffic.
- Tags add their signal on top: importance ≥ 0.7 starts in main, importance ≤ 0.3 stays in probation
  even when its key is remembered (protected blocks are outside eviction altogether, as with any policy).

Ghost lists hold at most :data:`GHOST_BUDGETS` times the budget's bytes worth of keys, and at most
:data:`MAX_GHOSTS` keys per list: 8-byte digests in an ordered map, ≈ 100 bytes each, so the learning
state of one tenant is bounded by ``2 × MAX_GHOSTS`` entries (≈ 26 MB) plus a few counters, and is
rebuilt empty after a restart (the parts themselves are persisted in the entries' ranks).
"""

from __future__ import annotations

import dataclasses
import enum
from collections import OrderedDict
from typing import Final

GHOST_BUDGETS: Final = 4
"""Each ghost list remembers keys worth this many budgets: reuse comes back within a few turnovers."""
MAX_GHOSTS: Final = 1 << 17
"""At most this many keys per ghost list (bounds memory whatever the block size)."""
HIGH_IMPORTANCE: Final = 0.7
LOW_IMPORTANCE: Final = 0.3
INITIAL_TARGET: Final = 0.5
"""Probation's first target, as a share of the budget (it moves from the first remembered miss on)."""


class Part(enum.IntEnum):
    """Where an entry stands; the value is the first byte of its rank (probation sorts first)."""

    PROBATION = 0
    MAIN = 1


def digest(full_key: bytes) -> int:
    """A ghost's identity: 8 bytes of the key (keys are hashes already, so any 8 bytes are uniform)."""
    return int.from_bytes(full_key[-8:], "big")


class _Ghosts:
    """Keys recently evicted from one part (oldest first), with their sizes; bounded by bytes and count."""

    def __init__(self) -> None:
        self.keys: OrderedDict[int, int] = OrderedDict()
        self.bytes = 0

    def add(self, key: int, size: int, max_bytes: int) -> None:
        old = self.keys.pop(key, None)
        self.bytes += size - (old or 0)
        self.keys[key] = size
        while self.keys and (self.bytes > max_bytes or len(self.keys) > MAX_GHOSTS):
            _, gone = self.keys.popitem(last=False)
            self.bytes -= gone

    def take(self, key: int) -> int | None:
        """The remembered size of ``key`` (forgetting it), or None."""
        size = self.keys.pop(key, None)
        if size is not None:
            self.bytes -= size
        return size

    def __len__(self) -> int:
        return len(self.keys)


@dataclasses.dataclass
class AdaptiveState:
    """One budget's parts, target and ghosts. The owner reports every change to what is held
    (:meth:`added`, :meth:`removed`, :meth:`promoted`); the state decides where new blocks go
    (:meth:`admit`) and which part gives up the next victim (:meth:`victim_part`)."""

    budget: int
    probation: int = 0
    main: int = 0
    target: float = -1.0
    recent: _Ghosts = dataclasses.field(default_factory=_Ghosts)
    frequent: _Ghosts = dataclasses.field(default_factory=_Ghosts)
    learned: int = 0
    """Stores of remembered keys (the target moved on each)."""

    def __post_init__(self) -> None:
        if self.target < 0:
            self.target = INITIAL_TARGET * self.budget

    def admit(self, key: int, size: int, importance: float) -> Part:
        """The part a block stored now (not held; ``key`` its :func:`digest`) starts in; learns from its
        ghost, if any."""
        if self.recent.take(key) is not None:
            self.learned += 1
            self.target = min(self.budget, self.target + size * max(1.0, _ratio(self.frequent, self.recent)))
            found = True
        elif self.frequent.take(key) is not None:
            self.learned += 1
            self.target = max(0.0, self.target - size * max(1.0, _ratio(self.recent, self.frequent)))
            found = True
        else:
            found = False
        if importance <= LOW_IMPORTANCE:
            return Part.PROBATION
        return Part.MAIN if found or importance >= HIGH_IMPORTANCE else Part.PROBATION

    def victim_part(self) -> Part:
        """Probation while it is over its target (or main is empty), else main."""
        if self.probation and (self.probation > self.target or not self.main):
            return Part.PROBATION
        return Part.MAIN

    def added(self, part: Part, size: int) -> None:
        if part is Part.PROBATION:
            self.probation += size
        else:
            self.main += size

    def removed(self, part: Part, size: int, key: int | None = None) -> None:
        """An entry left ``part``; with ``key`` (its :func:`digest`) it was evicted and is remembered."""
        if part is Part.PROBATION:
            self.probation -= size
        else:
            self.main -= size
        if key is not None:
            ghosts = self.recent if part is Part.PROBATION else self.frequent
            ghosts.add(key, size, GHOST_BUDGETS * self.budget)

    def promoted(self, size: int) -> None:
        """A probation entry was read: it moves to main."""
        self.probation -= size
        self.main += size

    def ghost_keys(self) -> int:
        return len(self.recent) + len(self.frequent)


def _ratio(a: _Ghosts, b: _Ghosts) -> float:
    return len(a) / len(b) if len(b) else 1.0


__all__ = [
    "GHOST_BUDGETS",
    "HIGH_IMPORTANCE",
    "LOW_IMPORTANCE",
    "MAX_GHOSTS",
    "AdaptiveState",
    "Part",
    "digest",
]
