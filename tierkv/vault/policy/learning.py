"""What the ``adaptive`` policy learns: it finds out from the traffic, with no setting, which blocks deserve
room. (:mod:`.adaptive` is the policy the store talks to; this module is its state, also run in process by
``tierkv bench trace``.)

Most KV blocks a vault stores are never read again (about three in four on public production traces),
and those that are come back soon. Three ideas, each measured on several traces (docs/performance/
retention.md):

1. **Leaf first.** A block is worth nothing without its parent (a lookup stops at the first missing
   block), so within one read or put the deepest block gets the oldest stamp: eviction trims chains from
   their ends, and what stays is still a usable prefix. (The store stamps a batch in reverse order.)
2. **Probation and main, as ARC** (Megiddo & Modha, 2003), in bytes. A new block enters probation; a block
   read, or stored again while its key is remembered in a *ghost* list, is in main. Probation gives up the
   victim while it holds more than its *target* bytes, else main does; the victim's key is remembered in
   the ghost list of the part it left. A block stored again while remembered from probation grows the
   target by its size (more when the other ghost list is longer), one remembered from main shrinks it.
3. **Miniature simulation decides between ARC and plain recency** (Waldspurger et al., ATC'17). One key in
   :data:`SAMPLE` (by hash) also goes through two shadow caches of 1/:data:`SAMPLE` of the budget — one
   ARC, one leaf-first LRU; while the LRU shadow has hit more lately (decayed over about
   :data:`MEMORY` sampled accesses), the victim is simply the least recent of the two parts' oldest
   entries. Where ARC's split does not pay (agents whose every step rereads the whole chain), the policy
   falls back to recency instead of losing to it.

Tags add their signal on top: importance ≥ 0.7 starts in main, ≤ 0.3 stays in probation even when
remembered (protected blocks are outside eviction altogether, as with every policy).

Learning state, per budget (the vault's, or a tenant's quota): two ghost lists of at most
:data:`GHOST_BUDGETS` budgets' bytes and :data:`MAX_GHOSTS` keys each; two shadow caches of 1/SAMPLE of
the budget, or of a smaller sample once they would hold more than :data:`MAX_SHADOW_KEYS` keys (the ARC
one with ghost lists of its own, at most GHOST_BUDGETS × MAX_SHADOW_KEYS keys each); a few counters. At
most 2 × 131,072 + 2 × 8,192 + 2 × 32,768 = 344,064 keys, ≈ 200–240 bytes each in Python
(``benchmarks/learning_memory.py``: ≈ 62 MB for a budget of a million blocks or more), and much less for
budgets of fewer blocks. It lives in memory and starts empty after a restart; which part an entry is in
is stored with the entry (its rank), so eviction order survives.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar, Final

GHOST_BUDGETS: Final = 4
"""Each ghost list remembers keys worth this many budgets: reuse comes back within a few turnovers."""
MAX_GHOSTS: Final = 1 << 17
"""At most this many keys per ghost list (bounds memory whatever the block size)."""
HIGH_IMPORTANCE: Final = 0.7
LOW_IMPORTANCE: Final = 0.3
INITIAL_TARGET: Final = 0.5
"""Probation's first target, as a share of the budget (it moves from the first remembered miss on)."""
SAMPLE: Final = 16
"""One key in this many feeds the shadow caches, which get this fraction of the budget (a power of two:
a key is sampled when its low bits are zero, see :func:`sampled`)."""
MEMORY: Final = 1000
"""The shadows' hit difference is decayed by 1/MEMORY per sampled access."""
_DECAY: Final = 1.0 - 1.0 / MEMORY
SAMPLE_MASK: Final = SAMPLE - 1
MAX_SHADOW_KEYS: Final = 8192
"""A shadow holds at most this many keys: past it, both shadows keep only the keys of a sample half as
large, in half the budget (fixed-size SHARDS, Waldspurger et al., FAST'15), so their memory is bounded
however many blocks a budget holds. The traces of docs/performance/retention.md stay below it."""
LAST_8: Final = struct.Struct(">Q")
"""A key's last 8 bytes as one big-endian int (:func:`digest` for keys of 8 bytes or more)."""


class Part(enum.IntEnum):
    """Where an entry stands; the value is the first byte of its rank (probation sorts first)."""

    PROBATION = 0
    MAIN = 1


_PROBATION: Final = Part.PROBATION
_MAIN: Final = Part.MAIN
"""The members as module constants: an enum member read through its class costs a lookup on every use,
and these are read on every Put."""
_OTHER: Final = {Part.PROBATION: Part.MAIN, Part.MAIN: Part.PROBATION}


def digest(full_key: bytes) -> int:
    """A key's identity here: its last 8 bytes, big-endian (keys are hashes already, so any 8 bytes are
    uniform); read with a compiled struct, cheaper than slicing for ``int.from_bytes``."""
    if len(full_key) < 8:
        return int.from_bytes(full_key, "big")
    key: int = LAST_8.unpack_from(full_key, -8)[0]
    return key


def sampled(key: int) -> bool:
    """Whether ``key`` is in the shadows' first sample: one in :data:`SAMPLE`, those whose low bits are
    zero (keys are hashes, so those bits are uniform; the store tests them on the key's last byte). A
    large budget narrows the sample further (:attr:`AdaptiveState.mask`)."""
    return not key & SAMPLE_MASK


Undo = list[tuple["_Ghosts", int, int]]
"""A journal of the keys ghost lists gave up: (list, key, what it held), oldest first (a key added is
not journaled: its sequence number tells it from those the last commit saw)."""
SIZE_BITS: Final = 48
_SIZE_MASK: Final = (1 << SIZE_BITS) - 1


class _Ghosts:
    """Keys recently evicted from one part (oldest first), bounded by bytes and count. Each key holds its
    sequence number and size packed in one int (``seq << SIZE_BITS | size``, one object per key: about 35
    bytes more than a size shared by every key of a block size): the sequence number is its place in the
    order, so an undone change can put a key back where it was (:meth:`Split.rollback`). ``journal``,
    when given, records the keys the list gives up."""

    def __init__(self, max_keys: int, journal: Undo | None = None) -> None:
        self.keys: OrderedDict[int, int] = OrderedDict()
        self.bytes = 0
        self.seq = 0
        self.max_keys = max_keys
        self.journal = journal

    def add(self, key: int, size: int, max_bytes: int) -> None:
        keys, journal = self.keys, self.journal
        if key in keys:
            old = keys.pop(key)
            self.bytes -= old & _SIZE_MASK
            if journal is not None:
                journal.append((self, key, old))
        self.seq += 1
        keys[key] = self.seq << SIZE_BITS | size  # not journaled: an undo drops keys newer than the commit
        held = self.bytes + size
        most = self.max_keys
        if held > max_bytes or len(keys) > most:  # a full list, once it is full: trim the oldest
            while keys and (held > max_bytes or len(keys) > most):
                gone, kept = keys.popitem(False)
                held -= kept & _SIZE_MASK
                if journal is not None:
                    journal.append((self, gone, kept))
        self.bytes = held

    def take(self, key: int) -> int | None:
        """The remembered size of ``key`` (forgetting it), or None."""
        kept = self.keys.pop(key, None)
        if kept is None:
            return None
        self.bytes -= kept & _SIZE_MASK
        if self.journal is not None:
            self.journal.append((self, key, kept))
        return kept & _SIZE_MASK

    def sizes(self) -> list[tuple[int, int]]:
        """(key, size), oldest first."""
        return [(key, kept & _SIZE_MASK) for key, kept in self.keys.items()]

    def restore(self, seq: int) -> None:
        """After the journal's keys were put back: drop the keys added after sequence number ``seq``, put
        the rest in sequence order and recount the bytes (an undo, so rare: O(n log n))."""
        self.seq = seq
        kept = sorted((item for item in self.keys.items() if item[1] >> SIZE_BITS <= seq), key=_SEQ)
        self.keys = OrderedDict(kept)
        self.bytes = sum(packed & _SIZE_MASK for _, packed in kept)

    def narrow(self, mask: int, max_bytes: int) -> None:
        """Keep only the keys with none of ``mask``'s bits (a smaller sample), within ``max_bytes``."""
        self.keys = OrderedDict((k, packed) for k, packed in self.keys.items() if not k & mask)
        self.bytes = sum(packed & _SIZE_MASK for packed in self.keys.values())
        while self.keys and (self.bytes > max_bytes or len(self.keys) > self.max_keys):
            self.bytes -= self.keys.popitem(False)[1] & _SIZE_MASK

    def __len__(self) -> int:
        return len(self.keys)


def _SEQ(item: tuple[int, int]) -> int:  # noqa: N802 - a sort key, named as the field it reads
    return item[1] >> SIZE_BITS


@dataclasses.dataclass
class Split:
    """ARC's learning for one budget: probation's target and the ghost lists. The owner counts the bytes
    in each part and passes them in (the store keeps them in its transaction's ledger)."""

    budget: int
    target: float = -1.0
    journaled: bool = False
    """Record every change since :meth:`commit`, so that :meth:`rollback` can undo them (the store's
    learner, whose changes belong to a write transaction that may abort; the shadows need none)."""
    learned: int = 0
    """Stores of remembered keys (the target moved on each)."""
    max_keys: int = 0
    """Keys per ghost list at most (0: :data:`MAX_GHOSTS`)."""
    journal: Undo | None = dataclasses.field(init=False)
    recent: _Ghosts = dataclasses.field(init=False)
    frequent: _Ghosts = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        if self.target < 0:
            self.target = INITIAL_TARGET * self.budget
        self.journal = [] if self.journaled else None
        most = self.max_keys or MAX_GHOSTS
        self.recent, self.frequent = _Ghosts(most, self.journal), _Ghosts(most, self.journal)
        self._committed = (self.target, self.learned, 0, 0)

    def commit(self) -> None:
        """What was learned since the last commit stands (its write transaction committed)."""
        if self.journal:
            self.journal.clear()
        self._committed = (self.target, self.learned, self.recent.seq, self.frequent.seq)

    def rollback(self) -> None:
        """Undo everything since the last commit (its write transaction aborted: the admissions and
        evictions it learned from never happened), ghost lists in their order included."""
        self.target, self.learned, recent_seq, frequent_seq = self._committed
        if self.recent.seq == recent_seq and self.frequent.seq == frequent_seq and not self.journal:
            return
        for ghosts, key, before in reversed(self.journal or ()):
            ghosts.keys[key] = before
        if self.journal:
            self.journal.clear()
        self.recent.restore(recent_seq)
        self.frequent.restore(frequent_seq)

    def admit(self, key: int, size: int, importance: float) -> Part:
        """The part a block stored now (not held) starts in; learns from its ghost, if any."""
        recent, frequent = self.recent, self.frequent
        if key in recent.keys:  # asked first: most keys are in neither list
            recent.take(key)
            grow = size * max(1.0, _ratio(frequent, recent))
            self.target = min(self.budget, self.target + grow)
            found = True
        elif key in frequent.keys:
            frequent.take(key)
            shrink = size * max(1.0, _ratio(recent, frequent))
            self.target = max(0.0, self.target - shrink)
            found = True
        else:
            found = False
        self.learned += found
        if importance <= LOW_IMPORTANCE:
            return _PROBATION
        return _MAIN if found or importance >= HIGH_IMPORTANCE else _PROBATION

    def arc_part(self, probation: int, main: int) -> Part:
        """ARC's choice: probation while it holds more than its target (or main is empty), else main."""
        if probation > 0 and (probation > self.target or main <= 0):
            return _PROBATION
        return _MAIN

    def remember(self, part: Part, key: int, size: int) -> None:
        """An entry of ``part`` was evicted: its key goes to that part's ghost list."""
        ghosts = self.recent if part is _PROBATION else self.frequent
        ghosts.add(key, size, GHOST_BUDGETS * self.budget)

    def remember_all(self, victims: Iterable[tuple[bytes, int, bool]]) -> None:
        """Evicted entries as the store names them, (full key, size, proven), in the order they went."""
        for fkey, size, proven in victims:
            self.remember(_MAIN if proven else _PROBATION, digest(fkey), size)

    def ghost_keys(self) -> int:
        return len(self.recent) + len(self.frequent)

    def narrow(self, mask: int, budget: int) -> None:
        """Learn for a smaller sample of keys (those with none of ``mask``'s bits) in ``budget``: the
        target keeps its share of the budget (a shadow's split only: it is never journaled)."""
        self.target *= budget / self.budget
        self.budget = budget
        for ghosts in (self.recent, self.frequent):
            ghosts.narrow(mask, GHOST_BUDGETS * budget)


def _ratio(a: _Ghosts, b: _Ghosts) -> float:
    return len(a) / len(b) if len(b) else 1.0


class Parts:
    """Two recency-ordered parts of keys with sizes and a stamp each: the in-memory form of what the vault
    keeps in its order index. Used by the shadows and by the bench's in-process twin."""

    def __init__(self) -> None:
        self.parts: dict[Part, OrderedDict[int, int]] = {p: OrderedDict() for p in Part}
        self.where: dict[int, Part] = {}
        self.stamp: dict[int, int] = {}
        self.clock = 0

    def __contains__(self, key: int) -> bool:
        return key in self.where

    def __len__(self) -> int:
        return len(self.where)

    def touch(self, key: int, part: Part, size: int) -> None:
        """``key`` is (now) in ``part`` and the most recent there."""
        where = self.where
        old = where.get(key)
        queue = self.parts[part]
        if old is part:
            queue[key] = size
            queue.move_to_end(key)
        else:  # new to the part: the insertion puts it last
            if old is not None:
                del self.parts[old][key]
            queue[key] = size
            where[key] = part
        self.clock += 1
        self.stamp[key] = self.clock

    def head(self, part: Part) -> int | None:
        """The stamp of ``part``'s least recent key (None when empty)."""
        queue = self.parts[part]
        return self.stamp[next(iter(queue))] if queue else None

    def pop(self, part: Part) -> tuple[int, int]:
        key, size = self.parts[part].popitem(last=False)
        del self.where[key]
        del self.stamp[key]
        return key, size

    def discard(self, key: int) -> tuple[Part, int]:
        """Forget ``key`` (held): its part and size."""
        part = self.where.pop(key)
        del self.stamp[key]
        return part, self.parts[part].pop(key)


class _MiniCache:
    """A shadow: the policy in small, ARC (``arc``) or leaf-first LRU, counting hits per access."""

    def __init__(self, budget: int, *, arc: bool) -> None:
        self.budget = max(1, budget)
        self.split = Split(self.budget, max_keys=GHOST_BUDGETS * MAX_SHADOW_KEYS) if arc else None
        self.held = Parts()
        self.used = {p: 0 for p in Part}
        self.total = 0
        """The sum of ``used`` (kept, not summed on every store)."""

    def access(self, keys: Sequence[tuple[int, int]], *, read: bool) -> int:
        """Hits among ``keys`` (key, size) in chain order; misses are stored, deepest stamped oldest."""
        hits = 0
        held, split, used, budget = self.held, self.split, self.used, self.budget
        where = held.where
        for key, size in reversed(keys):
            part = where.get(key)
            if part is not None:
                hits += 1
                charged = held.parts[part][key]  # as when stored: the caller's mean may have moved
                if read and part is _PROBATION and split is not None:
                    used[_PROBATION] -= charged
                    used[_MAIN] += charged
                    part = _MAIN
                held.touch(key, part, charged)
            elif size <= budget:
                new = _MAIN if split is None else split.admit(key, size, 0.5)
                while self.total + size > budget:
                    self._evict()
                held.touch(key, new, size)
                used[new] += size
                self.total += size
        return hits

    def narrow(self, mask: int, budget: int) -> None:
        """Model a smaller sample of keys (those with none of ``mask``'s bits) in ``budget``: the others
        are forgotten, then the oldest go until it fits (as a cache of that sample would hold)."""
        held, used = self.held, self.used
        for key in [k for k in held.where if k & mask]:
            part, size = held.discard(key)
            used[part] -= size
            self.total -= size
        self.budget = max(1, budget)
        if self.split is not None:
            self.split.narrow(mask, self.budget)
        while self.total > self.budget:
            self._evict()

    def _evict(self) -> None:
        part = _MAIN
        if self.split is not None:
            part = self.split.arc_part(self.used[_PROBATION], self.used[_MAIN])
        if not self.held.parts[part]:
            part = _OTHER[part]
        key, size = self.held.pop(part)
        self.used[part] -= size
        self.total -= size
        if self.split is not None:
            self.split.remember(part, key, size)


@dataclasses.dataclass
class AdaptiveState:
    """Everything ``adaptive`` learns for one budget: ARC's :class:`Split` and the two shadows."""

    budget: int
    split: Split = dataclasses.field(init=False)
    lru_lead: float = 0.0
    """Decayed (LRU shadow hits − ARC shadow hits): positive means plain recency is doing better."""
    journaled: ClassVar[bool] = False
    """Whether the split journals its changes (:attr:`Split.journaled`)."""

    def __post_init__(self) -> None:
        self.split = Split(self.budget, journaled=self.journaled)
        self.mask = SAMPLE_MASK
        """The shadows' keys are those with none of these bits: :data:`SAMPLE_MASK` at first, one bit
        more each time a shadow outgrows :data:`MAX_SHADOW_KEYS`."""
        self._shadow_lru = _MiniCache(self.budget // SAMPLE, arc=False)
        self._shadow_arc = _MiniCache(self.budget // SAMPLE, arc=True)

    def observe(self, keys: Sequence[tuple[int, int]], *, read: bool) -> None:
        """A batch read or stored, (key, size) in chain order: its sampled keys go through the shadows
        (the caller may pass only those with none of :data:`SAMPLE_MASK`'s bits)."""
        mask = self.mask
        mine = [(k, s) for k, s in keys if not k & mask]  # sampled, without a call per key
        if not mine:
            return
        lru, arc = self._shadow_lru, self._shadow_arc
        lead = lru.access(mine, read=read) - arc.access(mine, read=read)
        self.lru_lead = self.lru_lead * _DECAY ** len(mine) + lead
        if len(lru.held) > MAX_SHADOW_KEYS or len(arc.held) > MAX_SHADOW_KEYS:
            self.mask = mask = mask << 1 | 1
            for shadow in (lru, arc):
                shadow.narrow(mask, self.budget // (mask + 1))

    def keys(self) -> int:
        """Keys held in ghost lists and shadows (the learning state's size)."""
        shadows = (self._shadow_lru, self._shadow_arc)
        extra = self._shadow_arc.split.ghost_keys() if self._shadow_arc.split is not None else 0
        return self.split.ghost_keys() + sum(len(s.held) for s in shadows) + extra

    def victim_part(
        self, probation: int, main: int, heads: Callable[[], tuple[int | None, int | None]]
    ) -> Part:
        """Which part gives up the next victim, given the bytes in each part: ARC's choice, or, while the
        LRU shadow leads, the older of the two parts' oldest entries (``heads`` gives their stamps; asked
        only then, as finding them costs the store two cursor seeks)."""
        if self.lru_lead <= 0 or probation <= 0 or main <= 0:
            return self.split.arc_part(probation, main)
        return older_part(*heads())


def older_part(probation_head: int | None, main_head: int | None) -> Part:
    """The part whose oldest entry is older (given their stamps; None: the part is empty)."""
    if probation_head is None or main_head is None:
        return _MAIN if probation_head is None else _PROBATION
    return _PROBATION if probation_head < main_head else _MAIN


__all__ = [
    "GHOST_BUDGETS",
    "HIGH_IMPORTANCE",
    "INITIAL_TARGET",
    "LAST_8",
    "LOW_IMPORTANCE",
    "MAX_GHOSTS",
    "MAX_SHADOW_KEYS",
    "SAMPLE",
    "SAMPLE_MASK",
    "AdaptiveState",
    "Part",
    "Parts",
    "Split",
    "digest",
    "older_part",
    "sampled",
]
