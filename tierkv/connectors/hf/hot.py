"""The hot tier: an in-process LRU of recent prefixes, bounded in bytes.

Entries are keyed by their token ids and hold an opaque payload (the engine's KV for those tokens). A
lookup returns the entry sharing the longest token prefix with a prompt, so one stored conversation
serves every prompt that starts like it. When the byte budget is exceeded the least recently used
entries are handed to ``on_evict`` (store-on-evict: the connector ships their blocks to the vaults);
entries whose tokens are a prefix of a newer entry are dropped silently because the newer one covers
them.
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

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


UsableFn = Callable[[HotEntry[T], int], int]


class HotTier(Generic[T]):
    """Byte-bounded LRU of prefixes with longest-prefix lookup and an eviction callback.

    ``on_evict`` is called outside the lock, in the thread that caused the eviction; it must not block
    for long (the connector only enqueues the store).
    """

    def __init__(self, capacity_bytes: int, on_evict: Callable[[HotEntry[T]], None] | None = None) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self._capacity = capacity_bytes
        self._on_evict = on_evict
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
        return best, best_n

    def superseded_by(self, tokens: Sequence[int] | npt.NDArray[np.integer]) -> list[HotEntry[T]]:
        """Entries whose tokens are a prefix of ``tokens`` (a ``put`` of ``tokens`` drops them)."""
        query = as_tokens(tokens)
        with self._lock:
            return [e for e in self._entries.values() if self._is_prefix(e.tokens, query)]

    @staticmethod
    def _is_prefix(prefix: TokenArray, tokens: TokenArray) -> bool:
        n = int(prefix.shape[0])
        return n <= int(tokens.shape[0]) and common_prefix_len(prefix, tokens) == n

    def put(self, tokens: Sequence[int] | npt.NDArray[np.integer], payload: T, nbytes: int) -> HotEntry[T]:
        """Insert a prefix; drop the entries it supersedes and evict LRU entries over the budget.

        An entry larger than the whole budget is evicted at once (so it still reaches the cold tier).
        """
        arr = as_tokens(tokens).copy()
        arr.setflags(write=False)
        evicted: list[HotEntry[T]] = []
        with self._lock:
            entry = HotEntry(tokens=arr, payload=payload, nbytes=nbytes, _id=self._next_id)
            self._next_id += 1
            for old in [e for e in self._entries.values() if self._is_prefix(e.tokens, arr)]:
                self._remove(old)
            self._entries[entry._id] = entry
            self._bytes += nbytes
            while self._bytes > self._capacity and self._entries:
                _, victim = self._entries.popitem(last=False)
                self._bytes -= victim.nbytes
                evicted.append(victim)
            self.evictions += len(evicted)
        self._hand_over(evicted)
        return entry

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
