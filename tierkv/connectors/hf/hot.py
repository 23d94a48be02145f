"""The hot tier: an in-process cache of recent prefixes, bounded in bytes.

Entries are keyed by their token ids and hold an opaque payload (the engine's KV for those tokens). A
lookup returns the entry sharing the longest token prefix with a prompt, so one stored conversation
serves every prompt that starts like it. When the byte budget is exceeded entries are handed to
``on_evict`` (store-on-evict: the connector ships their blocks to the vaults) in the order the vault's
``context`` policy would evict them — lowest :func:`~tierkv.retention.score.context_score` first, from the
entry's importance, decayed hits, size and age (in turnovers of the tier's own events; prefix sharing
is 0: entries that share a prefix are merged into one) — and entries holding a protected block last.
With equal importance and no hits that is least recently used first. Entries whose tokens are a prefix
of a newer entry are dropped silently because the newer one covers them (it inherits their hits,
importance and protection).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from tierkv.config import ContextWeights
from tierkv.retention.classes import NEUTRAL_IMPORTANCE
from tierkv.retention.score import context_score, decayed_hits

logger = logging.getLogger(__name__)

T = TypeVar("T")

TokenArray = npt.NDArray[np.int64]


def as_tokens(tokens: Sequence[int] | npt.NDArray[np.integer]) -> TokenArray:
    """Token ids as a 1-D int64 array (no copy when they already are one)."""
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"token ids must be 1-D, got shape {arr.shape}")
    return arr


def common_prefix_len(a: TokenArray, b: TokenArray) -> int:
    """Number of leading positions where ``a`` and ``b`` hold the same token."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


@dataclass(eq=False)
class HotEntry(Generic[T]):
    """One cached prefix: its tokens, the engine payload covering them, and what it costs in bytes."""

    tokens: TokenArray
    payload: T
    nbytes: int
    _id: int = field(default=0, repr=False)
    importance: float = NEUTRAL_IMPORTANCE
    protected: bool = False
    hits: float = 0.0
    clock: int = 0
    """The tier's event count at the entry's last put or hit (its age is measured from there)."""

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


UsableFn = Callable[[HotEntry[T], int], int]


class HotTier(Generic[T]):
    """Byte-bounded prefixes with longest-prefix lookup and an eviction callback, evicted by the vault's
    ``context`` score (``weights``: ``[retention.weights]``, default :class:`~tierkv.config.ContextWeights`).

    ``on_evict`` is called outside the lock, in the thread that caused the eviction; it must not block
    for long (the connector only enqueues the store).
    """

    def __init__(
        self,
        capacity_bytes: int,
        on_evict: Callable[[HotEntry[T]], None] | None = None,
        *,
        weights: ContextWeights | None = None,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self._capacity = capacity_bytes
        self._on_evict = on_evict
        self._weights = weights or ContextWeights()
        self._clock = 0
        self._entries: OrderedDict[int, HotEntry[T]] = OrderedDict()
        self._bytes = 0
        self._next_id = 1
        self._lock = threading.Lock()
        self.evictions = 0

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def entries(self) -> list[HotEntry[T]]:
        """Snapshot of the entries, least recently used first."""
        with self._lock:
            return list(self._entries.values())

    def longest_prefix(
        self, tokens: Sequence[int] | npt.NDArray[np.integer], usable: UsableFn[T] | None = None
    ) -> tuple[HotEntry[T] | None, int]:
        """The entry serving the most leading tokens of ``tokens``, and how many it serves.

        ``usable(entry, lcp)`` may lower the count to what the payload can actually restore (e.g. the
        last position where a hybrid model's recurrent state was snapshotted). The winner becomes the
        most recently used entry.
        """
        query = as_tokens(tokens)
        best: HotEntry[T] | None = None
        best_n = 0
        with self._lock:
            for entry in self._entries.values():
                lcp = common_prefix_len(entry.tokens, query)
                if lcp == 0:
                    continue
                n = usable(entry, lcp) if usable is not None else lcp
                if n > best_n:
                    best, best_n = entry, n
            if best is not None:
                self._entries.move_to_end(best._id)
                self._clock += 1
                best.hits = self._hits(best) + 1
                best.clock = self._clock
        return best, best_n

    def superseded_by(self, tokens: Sequence[int] | npt.NDArray[np.integer]) -> list[HotEntry[T]]:
        """Entries whose tokens are a prefix of ``tokens`` (a ``put`` of ``tokens`` drops them)."""
        query = as_tokens(tokens)
        with self._lock:
            return [e for e in self._entries.values() if self._is_prefix(e.tokens, query)]

    def covers(self, tokens: Sequence[int] | npt.NDArray[np.integer]) -> bool:
        """Some entry holds all of ``tokens`` (they are a prefix of its tokens); not a hit."""
        query = as_tokens(tokens)
        with self._lock:
            return any(self._is_prefix(query, e.tokens) for e in self._entries.values())

    @staticmethod
    def _is_prefix(prefix: TokenArray, tokens: TokenArray) -> bool:
        n = int(prefix.shape[0])
        return n <= int(tokens.shape[0]) and common_prefix_len(prefix, tokens) == n

    def put(
        self,
        tokens: Sequence[int] | npt.NDArray[np.integer],
        payload: T,
        nbytes: int,
        *,
        importance: float = NEUTRAL_IMPORTANCE,
        protected: bool = False,
    ) -> HotEntry[T]:
        """Insert a prefix (``importance`` and ``protected``: those of its most protective block); drop
        the entries it supersedes and evict the lowest-scored entries over the budget.

        An entry larger than the whole budget is evicted at once (so it still reaches the cold tier).
        """
        arr = as_tokens(tokens).copy()
        arr.setflags(write=False)
        evicted: list[HotEntry[T]] = []
        with self._lock:
            self._clock += 1
            entry = HotEntry(arr, payload, nbytes, self._next_id, importance, protected, clock=self._clock)
            self._next_id += 1
            for old in [e for e in self._entries.values() if self._is_prefix(e.tokens, arr)]:
                entry.hits = max(entry.hits, self._hits(old))
                entry.importance = max(entry.importance, old.importance)
                entry.protected = entry.protected or old.protected
                self._remove(old)
            self._entries[entry._id] = entry
            self._bytes += nbytes
            while self._bytes > self._capacity and self._entries:
                victim = min(self._entries.values(), key=self._rank)
                self._remove(victim)
                evicted.append(victim)
            self.evictions += len(evicted)
        self._hand_over(evicted)
        return entry

    @property
    def weights(self) -> ContextWeights:
        """The ``context`` weights this tier scores entries with (the vault's, so both agree)."""
        return self._weights

    def _hits(self, entry: HotEntry[T]) -> float:
        """The entry's hits now, decayed as the vault decays them."""
        return decayed_hits(self._weights, entry.hits, self._clock - entry.clock, len(self._entries))

    def _rank(self, entry: HotEntry[T]) -> tuple[bool, float, int]:
        """Eviction order, lowest first: unprotected before protected, then the ``context`` score, then
        the older entry."""
        score = context_score(
            self._weights,
            importance=entry.importance,
            hits=self._hits(entry),
            sharing=0,
            size=entry.nbytes,
            age=(self._clock - entry.clock) / max(1, len(self._entries)),
        )
        return (entry.protected, score, entry.clock)

    def eviction_order(self) -> list[HotEntry[T]]:
        """The entries in the order they would be evicted (first to go first)."""
        with self._lock:
            return sorted(self._entries.values(), key=self._rank)

    def discard(self, entry: HotEntry[T]) -> bool:
        """Remove ``entry`` without handing it to ``on_evict``; False if it was not present."""
        with self._lock:
            if entry._id not in self._entries:
                return False
            self._remove(entry)
            return True

    def evict_all(self) -> int:
        """Hand every entry to ``on_evict`` (shutdown with persistence); returns how many."""
        with self._lock:
            victims = list(self._entries.values())
            self._entries.clear()
            self._bytes = 0
            self.evictions += len(victims)
        self._hand_over(victims)
        return len(victims)

    def clear(self) -> None:
        """Forget every entry without handing it over."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _remove(self, entry: HotEntry[T]) -> None:
        del self._entries[entry._id]
        self._bytes -= entry.nbytes

    def _hand_over(self, victims: list[HotEntry[T]]) -> None:
        if self._on_evict is None:
            return
        for victim in victims:
            try:
                self._on_evict(victim)
            except Exception:
                logger.exception("hot-tier eviction callback failed for a %d-token prefix", len(victim))


__all__ = ["HotEntry", "HotTier", "TokenArray", "as_tokens", "common_prefix_len"]
