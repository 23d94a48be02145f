"""The trace at block level, in process: a reference LRU and the offline optimum beside the vault runs.

A trace becomes a :class:`Stream`: per request the ids of its full blocks (chained, so equal ids are
equal prefixes) and how many of them an engine looks up (those before the prompt's last token). Every
simulated cache sees what a vault sees from an engine: a prefix lookup (hits are the leading blocks held),
a read of those hits, then a put of every block from the first miss on. Capacity is counted in blocks:
all blocks of a replay have one size, so a vault with ``capacity`` bytes holds ``capacity // charge``.

- :class:`LRUCache` is the reference LRU: tierkv's ``lru`` vault gives exactly its hits.
- :func:`belady` is the offline optimum: it knows every request to come and evicts the block whose next
  lookup is farthest away (deepest first among equals: a child is worth nothing without its parent).
  With ``bypass`` a block whose next lookup is farther than every held block's is not stored at all.
  For requests of one block each this is the classic optimum (tested against brute force); on chains it is
  the same rule, the reference no online policy is expected to reach.
- Any :class:`Cache` (a vault policy's in-process twin) runs through :func:`replay`.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, Protocol

from tierkv.retention.classes import NEUTRAL_IMPORTANCE
from tierkv.vault.policy.learning import AdaptiveState, Part, Parts, digest

NEVER: Final = 1 << 62
"""The next use of a block that is never looked up again."""


@dataclasses.dataclass(frozen=True)
class Stream:
    """A trace as block ids: ``requests[t] = (ids, lookable)``; ``tokens`` are the prompts' tokens."""

    requests: tuple[tuple[tuple[int, ...], int], ...]
    block_tokens: int
    tokens: int

    @property
    def distinct(self) -> int:
        return len({b for ids, _ in self.requests for b in ids})

    def token_rate(self, hits: Sequence[int]) -> float:
        """Token hit rate of per-request block hits."""
        return sum(hits) * self.block_tokens / self.tokens if self.tokens else 0.0


def stream_of(requests: Sequence[tuple[Sequence[bytes], int]], block_tokens: int, tokens: int) -> Stream:
    """A :class:`Stream` from (block keys, lookable) per request; a block's id is the digest the vault's
    policy knows its key by (so the twin samples the keys the vault samples), one int per distinct key
    (a trace resends its prefixes: most blocks come again)."""
    ids: dict[bytes, int] = {}
    out = []
    for keys, look in requests:
        row = []
        for k in keys:
            d = ids.get(k)
            if d is None:
                d = ids[k] = digest(k)
            row.append(d)
        out.append((tuple(row), look))
    return Stream(tuple(out), block_tokens, tokens)


class Cache(Protocol):
    """A block cache driven as an engine drives a vault; ``len`` is how many blocks it holds."""

    @property
    def evictions(self) -> int:
        """Blocks evicted so far (read-only, so a wrapper may report its cache's)."""

    def __len__(self) -> int: ...

    def holds(self, block: int) -> bool: ...

    def read(self, blocks: Sequence[int]) -> None:
        """The engine fetched these (the lookup's hits, in chain order)."""

    def store(self, blocks: Sequence[int]) -> None:
        """The engine put these (every block from the first miss on, in chain order)."""


def lookup(cache: Cache, ids: Sequence[int], lookable: int) -> int:
    """How many leading blocks of ``ids[:lookable]`` the cache holds."""
    hit = 0
    while hit < lookable and cache.holds(ids[hit]):
        hit += 1
    return hit


def replay(stream: Stream, cache: Cache) -> list[int]:
    """Block hits per request: lookup, read the hits, store the rest."""
    hits: list[int] = []
    for ids, lookable in stream.requests:
        hit = lookup(cache, ids, lookable)
        cache.read(ids[:hit])
        cache.store(ids[hit:])
        hits.append(hit)
    return hits


class Admission:
    """``cache``, storing of each request's blocks only those :meth:`admits` says to (an admission policy
    over any cache). Driven by :func:`replay`, which reads and then stores once per request, so the stores
    count the requests."""

    def __init__(self, cache: Cache, stream: Stream) -> None:
        self.cache = cache
        self._stream = stream
        self._request = 0

    @property
    def evictions(self) -> int:
        return self.cache.evictions

    def __len__(self) -> int:
        return len(self.cache)

    def holds(self, block: int) -> bool:
        return self.cache.holds(block)

    def read(self, blocks: Sequence[int]) -> None:
        self.cache.read(blocks)

    def store(self, blocks: Sequence[int]) -> None:
        t = self._request
        self._request += 1
        self.begin(t)
        first = len(self._stream.requests[t][0]) - len(blocks)
        admits = self.admits
        self.cache.store([b for i, b in enumerate(blocks, first) if admits(t, i)])

    def begin(self, request: int) -> None:
        """Request ``request`` is about to store (nothing to do unless a subclass keeps time)."""

    def admits(self, request: int, position: int) -> bool:
        """Whether the block at ``position`` of request ``request`` is stored."""
        raise NotImplementedError


class LRUCache:
    """Least recently read or stored goes first: the reference for the vault's ``lru``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._order: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._order)

    def holds(self, block: int) -> bool:
        return block in self._order

    def read(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            self._order.move_to_end(b)

    def store(self, blocks: Sequence[int]) -> None:
        order = self._order
        for b in blocks:
            order[b] = None
            order.move_to_end(b)
            while len(order) > self.capacity:
                order.popitem(last=False)
                self.evictions += 1


class AdaptiveCache:
    """The vault's ``adaptive`` policy in process: the same learning state
    (:class:`~tierkv.vault.policy.learning.AdaptiveState`), the same two parts, batches stamped deepest
    first as the store stamps them; a budget of ``capacity`` blocks, or of ``budget`` bytes of blocks of
    ``size`` bytes (as a vault counts them, rounding included)."""

    def __init__(self, capacity: int, *, budget: int = 0, size: int = 1) -> None:
        self.size = size
        self.budget = budget or capacity * size
        self.state = AdaptiveState(budget=self.budget)
        self.held = Parts()
        self.used = {p: 0 for p in Part}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.held)

    def holds(self, block: int) -> bool:
        return block in self.held

    def read(self, blocks: Sequence[int]) -> None:
        size = self.size
        self.state.observe([(b, size) for b in blocks], read=True)
        for b in reversed(blocks):
            if self.held.where[b] is Part.PROBATION:
                self.used[Part.PROBATION] -= size
                self.used[Part.MAIN] += size
            self.held.touch(b, Part.MAIN, size)

    def store(self, blocks: Sequence[int]) -> None:
        size = self.size
        self.state.observe([(b, size) for b in blocks], read=False)
        for b in reversed(blocks):
            part = self.held.where.get(b)
            if part is not None:
                self.held.touch(b, part, size)
                continue
            part = self.state.split.admit(b, size, NEUTRAL_IMPORTANCE)
            while self.held and sum(self.used.values()) + size > self.budget:
                self._evict()
            if size <= self.budget:
                self.held.touch(b, part, size)
                self.used[part] += size

    def _evict(self) -> None:
        held, used = self.held, self.used

        def heads() -> tuple[int | None, int | None]:
            return held.head(Part.PROBATION), held.head(Part.MAIN)

        part = self.state.victim_part(used[Part.PROBATION], used[Part.MAIN], heads)
        victim, size = held.pop(part)
        used[part] -= size
        self.state.split.remember(part, victim, size)
        self.evictions += 1


def next_uses(stream: Stream) -> list[list[int]]:
    """For each request and block, the index of the next request that looks the block up (NEVER if
    none): what the optimum knows and no online policy does."""
    later: dict[int, int] = {}
    out: list[list[int]] = [[] for _ in stream.requests]
    for t in range(len(stream.requests) - 1, -1, -1):
        ids, lookable = stream.requests[t]
        out[t] = [later.get(b, NEVER) for b in ids]
        for b in ids[:lookable]:
            later[b] = t
    return out


class _Farthest:
    """Held blocks by (next use, depth), farthest (then deepest) on top; stale heap entries skipped, and
    dropped when they outnumber the live ones three to one (every lookup re-sets its blocks, so a trace
    of millions of blocks would otherwise leave the heap with an entry per block ever looked up)."""

    slack = 1024
    """Entries tolerated beyond four per live one before the heap is rebuilt (a rebuild costs a step per
    live entry: a third of a step per push, amortized)."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[int, int]] = {}
        self._heap: list[tuple[int, int, int]] = []

    def set(self, block: int, when: int, depth: int) -> None:
        self.held[block] = (when, depth)
        heapq.heappush(self._heap, (-when, -depth, block))
        if len(self._heap) > 4 * len(self.held) + self.slack:
            self._heap = [(-w, -d, b) for b, (w, d) in self.held.items()]
            heapq.heapify(self._heap)

    def top(self) -> tuple[int, tuple[int, int]]:
        while True:
            when, depth, block = self._heap[0]
            if self.held.get(block) == (-when, -depth):
                return block, (-when, -depth)
            heapq.heappop(self._heap)

    def drop(self, block: int) -> None:
        del self.held[block]


def belady(stream: Stream, capacity: int, *, bypass: bool) -> list[int]:
    """Block hits per request of the offline optimum with ``capacity`` blocks (see the module text)."""
    uses = next_uses(stream)
    cache = _Farthest()
    hits: list[int] = []
    for t, (ids, lookable) in enumerate(stream.requests):
        hit = 0
        while hit < lookable and ids[hit] in cache.held:
            hit += 1
        hits.append(hit)
        nxt = uses[t]
        for depth, block in enumerate(ids):
            if depth < hit or block in cache.held or len(cache.held) < capacity:
                cache.set(block, nxt[depth], depth)
                continue
            if capacity <= 0:
                continue
            victim, standing = cache.top()
            if bypass and standing <= (nxt[depth], depth):
                continue
            cache.drop(victim)
            cache.set(block, nxt[depth], depth)
    return hits


__all__ = [
    "NEVER",
    "AdaptiveCache",
    "Admission",
    "Cache",
    "LRUCache",
    "Stream",
    "belady",
    "lookup",
    "next_uses",
    "replay",
    "stream_of",
]
