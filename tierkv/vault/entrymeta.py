"""What the vault keeps about an entry beyond its recency and size, and the per-class feedback it gives.

An entry stored with retention metadata (:class:`~tierkv.retention.BlockMeta`) gets a tail after the fixed
index record: expiry time, importance, decayed hit count, prefix-sharing count (stored children), the
protected flag, its source class and its parent key. An untagged entry has no tail: under ``lru`` and
``priority-lru`` it is stored exactly as before; ``context`` adds one once it has hits or children.

:class:`ClassBook` counts hits, misses and expired lookups per tenant and source class, with a rolling
5-minute window; a miss is attributed to the class of the entry it would have found when that entry was
evicted or expired recently (:class:`Ghosts` remembers the last :data:`MAX_GHOSTS`), else to ``""``.
Class names come from clients, so each tenant has at most :data:`MAX_CLASSES` of them; further names are
counted as :data:`OTHER_CLASS` (they stay metrics labels, and labels must stay few).
"""

from __future__ import annotations

import dataclasses
import math
import struct
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable

from tierkv.records import ClassStats
from tierkv.retention.classes import NEUTRAL_IMPORTANCE

_TAIL = struct.Struct("<dddQIBBH")
PROTECTED = 1
PROVEN = 2
"""Flag: the entry was read, or stored again while remembered (the ``adaptive`` policy's main part)."""
MAX_CLASSES = 64
OTHER_CLASS = "(other)"
MAX_GHOSTS = 100_000
WINDOW_S = 300.0
_BUCKET_S = 10.0
_BUCKETS = int(WINDOW_S / _BUCKET_S)


@dataclasses.dataclass(slots=True)
class EntryMeta:
    """The tail of an index record. ``expiry`` is wall-clock seconds (0: none): a time to live must hold
    across restarts, which the store's logical clock does not measure. ``population`` is the store's entry
    count when the entry was last ranked (the ``context`` rank depends on it, and the store must find the
    entry's order key again)."""

    expiry: float = 0.0
    importance: float = NEUTRAL_IMPORTANCE
    hits: float = 0.0
    sharing: int = 0
    protected: bool = False
    source: str = ""
    parent: bytes = b""
    population: int = 1
    proven: bool = False

    def pack(self) -> bytes:
        src = self.source.encode() if self.source else b""
        head = _TAIL.pack(
            self.expiry,
            self.importance,
            self.hits,
            self.population,
            min(self.sharing, 0xFFFFFFFF),
            (PROTECTED if self.protected else 0) | (PROVEN if self.proven else 0),
            len(src),
            len(self.parent),
        )
        return b"".join((head, src, self.parent)) if src or self.parent else head

    @classmethod
    def unpack(cls, raw: bytes | memoryview, offset: int = 0) -> EntryMeta:
        """The tail in ``raw`` from ``offset`` on; ValueError when it is not one (the entry is then treated
        as corrupt). Most tails carry neither a source nor a parent: those are not sliced."""
        start = offset + _TAIL.size
        if len(raw) < start:
            raise ValueError("index tail too short")
        expiry, importance, hits, population, sharing, flags, n_src, n_parent = _TAIL.unpack_from(raw, offset)
        end = start + n_src
        if len(raw) != end + n_parent or not (math.isfinite(expiry) and math.isfinite(hits)):
            raise ValueError("index tail does not add up")
        source = bytes(raw[start:end]).decode() if n_src else ""
        parent = bytes(raw[end:]) if n_parent else b""
        protected, proven = bool(flags & PROTECTED), bool(flags & PROVEN)
        return cls(expiry, importance, hits, sharing, protected, source, parent, population, proven)

    def expired(self, now: float) -> bool:
        return 0.0 < self.expiry <= now


def expiry_of(raw_tail: bytes | memoryview) -> float:
    """Just the expiry of a packed tail (reads check it without decoding the rest)."""
    return float(struct.unpack_from("<d", raw_tail)[0]) if len(raw_tail) >= _TAIL.size else 0.0


class _Window:
    """Hits and lookups of the last :data:`WINDOW_S` seconds, in 10-second buckets."""

    __slots__ = ("epochs", "hits", "lookups")

    def __init__(self) -> None:
        self.epochs = [-1] * _BUCKETS
        self.hits = [0] * _BUCKETS
        self.lookups = [0] * _BUCKETS

    def add(self, hits: int, lookups: int, now: float) -> None:
        epoch = int(now // _BUCKET_S)
        i = epoch % _BUCKETS
        if self.epochs[i] != epoch:
            self.epochs[i], self.hits[i], self.lookups[i] = epoch, 0, 0
        self.hits[i] += hits
        self.lookups[i] += lookups

    def totals(self, now: float) -> tuple[int, int]:
        oldest = int(now // _BUCKET_S) - _BUCKETS + 1
        live = [i for i, e in enumerate(self.epochs) if e >= oldest]
        return sum(self.hits[i] for i in live), sum(self.lookups[i] for i in live)


@dataclasses.dataclass
class _Counts:
    hits: int = 0
    misses: int = 0
    expired: int = 0
    window: _Window = dataclasses.field(default_factory=_Window)


class Ghosts:
    """The class of recently evicted or expired entries, so a later miss on them is counted there."""

    def __init__(self, limit: int = MAX_GHOSTS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._ghosts: OrderedDict[tuple[str, bytes], str] = OrderedDict()

    def add(self, items: Iterable[tuple[str, bytes, str]]) -> None:
        with self._lock:
            for tenant, fkey, source in items:
                self._ghosts[(tenant, fkey)] = source
                self._ghosts.move_to_end((tenant, fkey))
            while len(self._ghosts) > self.limit:
                self._ghosts.popitem(last=False)

    def classes(self, tenant: str, fkeys: Iterable[bytes]) -> list[str]:
        with self._lock:
            return [self._ghosts.get((tenant, f), "") for f in fkeys]


class ClassBook:
    """Per tenant and class: lookup counters (in memory, since start) and a bounded set of class labels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], _Counts] = {}
        self._labels: dict[str, set[str]] = {}

    def label(self, tenant: str, source: str) -> str:
        """The name a class is counted under: itself, or :data:`OTHER_CLASS` past :data:`MAX_CLASSES`."""
        with self._lock:
            known = self._labels.setdefault(tenant, set())
            if source in known:
                return source
            if len(known) >= MAX_CLASSES:
                return OTHER_CLASS
            known.add(source)
            return source

    def note(self, tenant: str, hits: Counter[str], misses: Counter[str], expired: Counter[str]) -> None:
        """Count one batch of lookups (classes as stored; labels are applied here)."""
        now = time.monotonic()
        grouped: dict[str, tuple[int, int, int]] = {}
        for source in set(hits) | set(misses) | set(expired):
            label = self.label(tenant, source)
            h, m, e = grouped.get(label, (0, 0, 0))
            grouped[label] = (h + hits[source], m + misses[source], e + expired[source])
        with self._lock:
            for label, (h, m, e) in grouped.items():
                c = self._counts.setdefault((tenant, label), _Counts())
                c.hits, c.misses, c.expired = c.hits + h, c.misses + m, c.expired + e
                c.window.add(h, h + m, now)

    def usage(
        self,
        tenant_filter: str | None,
        stored: dict[tuple[str, str], tuple[int, int, int]],
    ) -> list[ClassStats]:
        """Every (tenant, class) with lookups or stored entries; ``stored`` maps it to (keys, bytes,
        protected bytes)."""
        now = time.monotonic()
        with self._lock:
            names = sorted(set(self._counts) | set(stored))
            out = []
            for tenant, source in names:
                if tenant_filter is not None and tenant != tenant_filter:
                    continue
                c = self._counts.get((tenant, source)) or _Counts()
                keys, nbytes, protected = stored.get((tenant, source), (0, 0, 0))
                h5, l5 = c.window.totals(now)
                out.append(
                    ClassStats(tenant, source, keys, nbytes, c.hits, c.misses, c.expired, h5, l5, protected)
                )
        return out


__all__ = [
    "MAX_CLASSES",
    "MAX_GHOSTS",
    "OTHER_CLASS",
    "WINDOW_S",
    "ClassBook",
    "EntryMeta",
    "Ghosts",
    "expiry_of",
]
