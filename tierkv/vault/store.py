"""The vault's storage engine: LMDB, bounded in bytes, checksummed, crash-consistent.

Four LMDB databases live in one environment:

``data``   full key → the blob, exactly as the client sent it (no framing, no copy on the way in)
``index``  full key → charge (u64), clock (u64), priority (u16), xxh3-64 checksum (u64)
``order``  policy rank + full key → empty; the eviction order, lowest first
``meta``   bookkeeping: used bytes, entry count, logical clock, policy name

A full key is ``len(namespace) ‖ namespace ‖ key``. An entry is charged ``len(namespace) + len(key) +
len(blob)`` bytes against ``max_bytes``. Every Put batch is one write transaction that makes its own room
by evicting from the front of ``order`` before each write, and stores the new totals in ``meta`` in the same
transaction: the budget holds at every commit and the accounting is exactly as durable as the data.

Reads never open a write transaction: a hit is recorded in memory and the new recency is written by the
next Put or by the maintenance thread (so recency is approximate by at most one maintenance interval).
Every read verifies the checksum (seeded with the full key, so a blob can't be served under another key);
a mismatch is reported as CORRUPT, counted and the entry dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lmdb
import xxhash

from tierkv.vault.policy import EntryInfo, EvictionPolicy, LRUPolicy

log = logging.getLogger(__name__)

_INDEX = struct.Struct("<QQHQ")
_U64 = struct.Struct("<Q")
_MIB = 1024 * 1024
_MAX_TOUCHES = 200_000


class Lookup(enum.IntEnum):
    FOUND = 1
    MISSING = 2
    CORRUPT = 3


class StoreFullError(Exception):
    """The store could not make room (map cannot grow and eviction freed too little, or disk full)."""


@dataclasses.dataclass(frozen=True)
class PutOutcome:
    stored: int
    rejected: list[int]
    evicted: int


@dataclasses.dataclass(frozen=True)
class StoreStats:
    keys: int
    used_bytes: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int
    corrupt: int
    map_size: int


@dataclasses.dataclass(slots=True)
class _Index:
    charge: int
    clock: int
    priority: int
    checksum: int

    @classmethod
    def unpack(cls, raw: bytes | memoryview) -> _Index:
        return cls(*_INDEX.unpack(raw))

    def pack(self) -> bytes:
        return _INDEX.pack(self.charge, self.clock, self.priority, self.checksum)


def full_key(namespace: bytes, key: bytes) -> bytes:
    if len(namespace) > 255:
        raise ValueError("namespace longer than 255 bytes")
    return bytes((len(namespace),)) + namespace + key


def checksum(fkey: bytes, data: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data, seed=xxhash.xxh3_64_intdigest(fkey))


class _SharedExclusive:
    """Many transactions at once, or one map resize alone (LMDB forbids resizing under open txns)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class Store:
    """A byte-bounded LMDB key-value store with pluggable eviction. Thread-safe."""

    def __init__(
        self,
        path: str | Path,
        max_bytes: int,
        *,
        sync_mode: str = "durable",
        policy: EvictionPolicy | None = None,
        maintenance_interval_s: float = 1.0,
        map_size: int | None = None,
        max_map_size: int | None = None,
    ) -> None:
        if sync_mode not in ("durable", "fast"):
            raise ValueError(f"sync_mode must be 'durable' or 'fast', not {sync_mode!r}")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(max_bytes)
        self.sync_mode = sync_mode
        self.policy: EvictionPolicy = policy or LRUPolicy()
        self._rank_len = len(self.policy.rank(EntryInfo(clock=0, size=0, priority=0)))
        initial = map_size or _round_up(2 * self.max_bytes + 64 * _MIB, _MIB)
        self._max_map_size = max_map_size or _round_up(4 * self.max_bytes + 1024 * _MIB, _MIB)
        self._env = lmdb.open(
            str(self.path),
            map_size=initial,
            max_dbs=4,
            sync=sync_mode == "durable",
            metasync=sync_mode == "durable",
            max_readers=256,
            readahead=False,
        )
        self._data = self._env.open_db(b"data")
        self._index = self._env.open_db(b"index")
        self._order = self._env.open_db(b"order")
        self._meta = self._env.open_db(b"meta")
        self._write_lock = threading.Lock()
        self._rw = _SharedExclusive()
        self._touch_lock = threading.Lock()
        self._touches: OrderedDict[bytes, None] = OrderedDict()
        self.hits = self.misses = self.evictions = self.corrupt = 0
        self._counter_lock = threading.Lock()
        self._used, self._count, self._clock = self._load_meta()
        self._closed = threading.Event()
        self._maintainer = threading.Thread(
            target=self._maintain, args=(maintenance_interval_s,), name="tierkv-store-maint", daemon=True
        )
        self._maintainer.start()

    # -- bookkeeping -------------------------------------------------------------------------------

    def _load_meta(self) -> tuple[int, int, int]:
        with self._env.begin(write=True) as txn:
            used = _get_u64(txn, self._meta, b"used")
            count = _get_u64(txn, self._meta, b"count")
            clock = _get_u64(txn, self._meta, b"clock")
            stored_policy = txn.get(b"policy", db=self._meta)
            if stored_policy is not None and stored_policy.decode() != self.policy.name:
                log.info(
                    "eviction policy changed from %s to %s: re-ranking",
                    stored_policy.decode(),
                    self.policy.name,
                )
                self._rerank(txn)
            txn.put(b"policy", self.policy.name.encode(), db=self._meta)
        return used, count, clock

    def _rerank(self, txn: lmdb.Transaction) -> None:
        txn.drop(self._order, delete=False)
        with txn.cursor(db=self._index) as cur:
            for fkey, raw in cur:
                entry = _Index.unpack(raw)
                txn.put(self._rank(entry) + bytes(fkey), b"", db=self._order)

    def _rank(self, entry: _Index) -> bytes:
        return self.policy.rank(EntryInfo(clock=entry.clock, size=entry.charge, priority=entry.priority))

    def _save_meta(self, txn: lmdb.Transaction, used: int, count: int, clock: int) -> None:
        txn.put(b"used", _U64.pack(used), db=self._meta)
        txn.put(b"count", _U64.pack(count), db=self._meta)
        txn.put(b"clock", _U64.pack(clock), db=self._meta)

    # -- writes ------------------------------------------------------------------------------------

    def put_many(
        self, namespace: bytes, items: Sequence[tuple[bytes, bytes | bytearray | memoryview, int]]
    ) -> PutOutcome:
        """Store ``(key, blob, priority)`` items in one transaction, evicting as needed to stay in budget."""
        prepared = [(full_key(namespace, key), data, prio) for key, data, prio in items]
        with self._write_lock:
            for _attempt in range(6):
                try:
                    with self._rw.shared():
                        return self._put_txn(prepared)
                except lmdb.MapFullError:
                    self._grow_map()
            raise StoreFullError("LMDB map is full and cannot grow further")

    def _put_txn(self, items: Sequence[tuple[bytes, bytes | bytearray | memoryview, int]]) -> PutOutcome:
        used, count, clock = self._used, self._count, self._clock
        rejected: list[int] = []
        evicted = stored = 0
        try:
            with self._env.begin(write=True) as txn:
                clock = self._apply_touches(txn, clock)
                order = txn.cursor(db=self._order)
                for i, (fkey, data, priority) in enumerate(items):
                    charge = len(fkey) - 1 + len(data)
                    if charge > self.max_bytes:
                        rejected.append(i)
                        continue
                    old_raw = txn.get(fkey, db=self._index)
                    if old_raw is not None:
                        old = _Index.unpack(old_raw)
                        txn.delete(self._rank(old) + fkey, db=self._order)
                        used -= old.charge
                        count -= 1
                    while used + charge > self.max_bytes and order.first():
                        victim_fkey = bytes(order.key()[self._rank_len :])
                        victim_raw = txn.get(victim_fkey, db=self._index)
                        order.delete()
                        if victim_raw is None:
                            continue
                        victim = _Index.unpack(victim_raw)
                        txn.delete(victim_fkey, db=self._index)
                        txn.delete(victim_fkey, db=self._data)
                        used -= victim.charge
                        count -= 1
                        evicted += 1
                    clock += 1
                    entry = _Index(charge, clock, priority, checksum(fkey, data))
                    txn.put(fkey, data, db=self._data)
                    txn.put(fkey, entry.pack(), db=self._index)
                    txn.put(self._rank(entry) + fkey, b"", db=self._order)
                    used += charge
                    count += 1
                    stored += 1
                self._save_meta(txn, used, count, clock)
        except lmdb.MapFullError:
            raise
        except lmdb.Error as exc:
            raise StoreFullError(f"LMDB write failed: {exc}") from exc
        self._used, self._count, self._clock = used, count, clock
        with self._counter_lock:
            self.evictions += evicted
        return PutOutcome(stored=stored, rejected=rejected, evicted=evicted)

    def _grow_map(self) -> None:
        current = self._env.info()["map_size"]
        if current >= self._max_map_size:
            raise StoreFullError(
                f"LMDB map at its cap of {self._max_map_size} bytes; free space on disk or lower max_bytes"
            )
        new = min(self._max_map_size, current * 2)
        with self._rw.exclusive():
            self._env.set_mapsize(new)
        log.info("grew LMDB map from %d to %d bytes", current, new)

    def delete(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        return self._delete_entries(lambda _txn: [full_key(namespace, k) for k in keys])

    def flush(self, namespace: bytes = b"") -> int:
        """Delete every entry of ``namespace`` (every entry at all when it is empty)."""
        if namespace:
            prefix = full_key(namespace, b"")
            deleted = self._delete_entries(lambda txn: self._keys_with_prefix(txn, prefix))
        else:
            with self._write_lock, self._rw.shared(), self._env.begin(write=True) as txn:
                deleted = self._count
                for db in (self._data, self._index, self._order):
                    txn.drop(db, delete=False)
                self._save_meta(txn, 0, 0, self._clock)
            self._used, self._count = 0, 0
        with self._touch_lock:
            self._touches.clear()
        return deleted

    def _keys_with_prefix(self, txn: lmdb.Transaction, prefix: bytes) -> list[bytes]:
        found: list[bytes] = []
        with txn.cursor(db=self._index) as cur:
            if cur.set_range(prefix):
                for fkey in cur.iternext(keys=True, values=False):
                    if not bytes(fkey).startswith(prefix):
                        break
                    found.append(bytes(fkey))
        return found

    def _delete_entries(self, select: Callable[[lmdb.Transaction], Sequence[bytes]]) -> int:
        """Drop the entries ``select`` names, in one write transaction with the new totals."""
        with self._write_lock, self._rw.shared(), self._env.begin(write=True) as txn:
            used, count, deleted = self._used, self._count, 0
            for fkey in select(txn):
                charge = self._drop(txn, fkey)
                if charge is not None:
                    used -= charge
                    count -= 1
                    deleted += 1
            self._save_meta(txn, used, count, self._clock)
        self._used, self._count = used, count
        return deleted

    def _drop(self, txn: lmdb.Transaction, fkey: bytes) -> int | None:
        raw = txn.get(fkey, db=self._index)
        if raw is None:
            return None
        entry = _Index.unpack(raw)
        txn.delete(self._rank(entry) + fkey, db=self._order)
        txn.delete(fkey, db=self._index)
        txn.delete(fkey, db=self._data)
        return entry.charge

    # -- reads -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def view_many(
        self, namespace: bytes, keys: Sequence[bytes]
    ) -> Iterator[list[tuple[Lookup, memoryview | None]]]:
        """Zero-copy, checksum-verified views of the blobs, valid only inside the ``with`` block.

        Keep the block short: an open read transaction pins LMDB pages.
        """
        fkeys = [full_key(namespace, k) for k in keys]
        results: list[tuple[Lookup, memoryview | None]] = []
        corrupt: list[bytes] = []
        with self._rw.shared():
            txn = self._env.begin(buffers=True)
            try:
                for fkey in fkeys:
                    raw = txn.get(fkey, db=self._index)
                    data = txn.get(fkey, db=self._data) if raw is not None else None
                    if raw is None:
                        results.append((Lookup.MISSING, None))
                    elif (
                        data is None
                        or len(raw) != _INDEX.size
                        or (checksum(fkey, data) != _Index.unpack(raw).checksum)
                    ):
                        corrupt.append(fkey)
                        results.append((Lookup.CORRUPT, None))
                    else:
                        results.append((Lookup.FOUND, data))
                yield results
            finally:
                txn.abort()
        found = [f for f, (status, _) in zip(fkeys, results, strict=True) if status is Lookup.FOUND]
        with self._counter_lock:
            self.hits += len(found)
            self.misses += len(fkeys) - len(found)
            self.corrupt += len(corrupt)
        self._touch(found)
        if corrupt:
            log.warning("dropping %d corrupt entries", len(corrupt))
            self._delete_entries(lambda _txn: corrupt)

    def get_many(self, namespace: bytes, keys: Sequence[bytes]) -> list[bytes | None]:
        """Copying convenience over :meth:`view_many`: None for missing or corrupt."""
        with self.view_many(namespace, keys) as views:
            return [bytes(v) if v is not None else None for _, v in views]

    def prefix_lookup(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        """How many leading keys are present (not verified: the BatchGet that follows verifies)."""
        present: list[bytes] = []
        with self._rw.shared(), self._env.begin(buffers=True) as txn:
            for key in keys:
                fkey = full_key(namespace, key)
                if txn.get(fkey, db=self._index) is None:
                    break
                present.append(fkey)
        self._touch(present)
        return len(present)

    # -- recency -----------------------------------------------------------------------------------

    def _touch(self, fkeys: Sequence[bytes]) -> None:
        if not fkeys:
            return
        with self._touch_lock:
            for fkey in fkeys:
                self._touches[fkey] = None
                self._touches.move_to_end(fkey)
            while len(self._touches) > _MAX_TOUCHES:
                self._touches.popitem(last=False)

    def _apply_touches(self, txn: lmdb.Transaction, clock: int) -> int:
        with self._touch_lock:
            touched, self._touches = self._touches, OrderedDict()
        for fkey in touched:
            raw = txn.get(fkey, db=self._index)
            if raw is None:
                continue
            entry = _Index.unpack(raw)
            txn.delete(self._rank(entry) + fkey, db=self._order)
            clock += 1
            entry.clock = clock
            txn.put(fkey, entry.pack(), db=self._index)
            txn.put(self._rank(entry) + fkey, b"", db=self._order)
        return clock

    def apply_touches(self) -> None:
        """Write pending recency updates now (the maintenance thread does this every interval)."""
        with self._touch_lock:
            if not self._touches:
                return
        with self._write_lock, self._rw.shared(), self._env.begin(write=True) as txn:
            clock = self._apply_touches(txn, self._clock)
            self._save_meta(txn, self._used, self._count, clock)
        self._clock = clock

    def _maintain(self, interval: float) -> None:
        while not self._closed.wait(interval):
            try:
                self.apply_touches()
                if self.sync_mode == "fast":
                    self._env.sync(True)
            except Exception:
                log.exception("store maintenance failed")

    # -- lifecycle ---------------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        with self._counter_lock:
            return StoreStats(
                keys=self._count,
                used_bytes=self._used,
                max_bytes=self.max_bytes,
                hits=self.hits,
                misses=self.misses,
                evictions=self.evictions,
                corrupt=self.corrupt,
                map_size=self._env.info()["map_size"],
            )

    def sync(self) -> None:
        self._env.sync(True)

    def close(self) -> None:
        """Write pending recency, fsync and close. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._maintainer.join(timeout=5)
        try:
            self.apply_touches()
            self._env.sync(True)
        finally:
            self._env.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _get_u64(txn: lmdb.Transaction, db: Any, key: bytes) -> int:
    raw = txn.get(key, db=db)
    return 0 if raw is None else int(_U64.unpack(raw)[0])


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step
