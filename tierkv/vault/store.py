"""The vault's storage engine: LMDB, bounded in bytes, checksummed, crash-consistent.

Four LMDB databases live in one environment:

``data``   full key → the blob, exactly as the client sent it (no framing, no copy on the way in)
``index``  full key → charge (u64), clock (u64), priority (u16), xxh3-64 checksum (u64)
``order``  policy rank + full key → empty; the eviction order, lowest first
``meta``   bookkeeping: used bytes, entry count, logical clock, policy name

A full key is ``len(namespace) ‖ namespace ‖ key``. An entry is charged ``len(namespace) + len(key) +
len(blob)`` bytes against ``max_bytes``. A Put batch is written in write transactions of at most
``max_bytes / 16`` bytes (one for most batches); each makes its own room by evicting from the front of
``order`` before each write and stores the new totals in ``meta`` in the same transaction: the budget holds
at every commit and the accounting is exactly as durable as the data.

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
import re
import struct
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import lmdb
import xxhash

from tierkv.vault.files import OnDamage, VaultDirectory, disk_full_message
from tierkv.vault.policy import EntryInfo, EvictionPolicy, LRUPolicy

log = logging.getLogger(__name__)

_INDEX = struct.Struct("<QQHQ")
_U64 = struct.Struct("<Q")
_MIB = 1024 * 1024
_MAX_TOUCHES = 200_000
_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_TENANT = "default"
MAX_TENANTS = 64
READ_TXN_MAX_S = 0.5
"""A reader in the middle of a reply ends its read transaction after this long (and reopens one)."""


class Lookup(enum.IntEnum):
    FOUND = 1
    MISSING = 2
    CORRUPT = 3


class StoreFullError(Exception):
    """The store could not make room (map cannot grow and eviction freed too little, or disk full)."""


class DiskFullError(StoreFullError):
    """The filesystem under the store has no room for a write (LMDB reports it as an I/O error)."""


class UnknownTenantError(KeyError):
    """A call named a tenant this store does not have."""


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
    """Many transactions at once, or one map resize alone (LMDB forbids resizing under open txns).

    A waiting resize holds back new transactions (so a stream of readers cannot starve it), and readers
    in the middle of a long reply look at :attr:`exclusive_waiting` to end their transaction early.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @property
    def exclusive_waiting(self) -> bool:
        return self._waiting > 0

    def acquire_shared(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1

    def release_shared(self) -> None:
        with self._cond:
            self._shared -= 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        self.acquire_shared()
        try:
            yield
        finally:
            self.release_shared()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


def check_tenant(name: str) -> str:
    """``name`` if it can name a tenant (letters, digits, ``_.-``, at most 64); ValueError otherwise."""
    if not _TENANT_NAME.fullmatch(name):
        raise ValueError(f"tenant name {name!r} must be 1-64 letters, digits, '_', '.' or '-'")
    return name


@dataclasses.dataclass(eq=False)
class _Tenant:
    """One tenant's three LMDB databases, its quota and its committed figures."""

    name: str
    data: Any
    index: Any
    order: Any
    quota: int = 0
    used: int = 0
    count: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    corrupt: int = 0

    @property
    def meta_suffix(self) -> bytes:
        return b"/" + self.name.encode()


@dataclasses.dataclass(frozen=True)
class TenantUsage:
    tenant: str
    keys: int
    used_bytes: int
    quota_bytes: int
    evictions: int


class _Ledger:
    """Usage figures inside one write transaction; the store takes them only once it has committed."""

    def __init__(self, tenants: Iterable[_Tenant], clock: int) -> None:
        self.clock = clock
        self.used = {t.name: t.used for t in tenants}
        self.count = {t.name: t.count for t in tenants}
        self.total = sum(self.used.values())
        self.evicted: Counter[str] = Counter()

    def add(self, tenant: str, charge: int) -> None:
        self.used[tenant] += charge
        self.count[tenant] += 1
        self.total += charge

    def remove(self, tenant: str, charge: int) -> None:
        self.used[tenant] -= charge
        self.count[tenant] -= 1
        self.total -= charge

    def clear(self, tenant: str) -> int:
        self.total -= self.used[tenant]
        dropped, self.used[tenant], self.count[tenant] = self.count[tenant], 0, 0
        return dropped


class Reader:
    """Checksum-verified, zero-copy reads of one tenant's entries in short read transactions.

    A view returned by :meth:`get` is valid until :meth:`release` or :meth:`close`. The transaction opens
    on the first ``get`` after a release, so a caller that sends views to a slow peer releases (after
    copying what it still needs) instead of pinning LMDB pages and blocking map growth for as long as the
    peer takes; :attr:`stale` says when a caller should release even though nothing is blocked.
    """

    def __init__(self, store: Store, tenant: _Tenant) -> None:
        self._store = store
        self._tenant = tenant
        self._txn: lmdb.Transaction | None = None
        self._opened = 0.0
        self._found: list[bytes] = []
        self._corrupt: list[bytes] = []
        self._lookups = 0

    @property
    def stale(self) -> bool:
        """The open transaction is old or a map resize waits for it."""
        return self._txn is not None and (
            time.monotonic() - self._opened > READ_TXN_MAX_S or self._store._rw.exclusive_waiting
        )

    def get(self, namespace: bytes, key: bytes) -> tuple[Lookup, memoryview | None]:
        fkey = full_key(namespace, key)
        txn = self._begin()
        self._lookups += 1
        raw = txn.get(fkey, db=self._tenant.index)
        if raw is None:
            return Lookup.MISSING, None
        data = txn.get(fkey, db=self._tenant.data)
        if data is None or len(raw) != _INDEX.size or checksum(fkey, data) != _Index.unpack(raw).checksum:
            self._corrupt.append(fkey)
            return Lookup.CORRUPT, None
        self._found.append(fkey)
        return Lookup.FOUND, memoryview(data)

    def _begin(self) -> lmdb.Transaction:
        if self._txn is None:
            self._store._rw.acquire_shared()
            try:
                self._txn = self._store._env.begin(buffers=True)
            except BaseException:
                self._store._rw.release_shared()
                raise
            self._opened = time.monotonic()
        return self._txn

    def release(self) -> None:
        """End the read transaction: every view handed out so far is invalid from here on."""
        if self._txn is not None:
            txn, self._txn = self._txn, None
            txn.abort()
            self._store._rw.release_shared()

    def close(self) -> None:
        """Release, then count hits and misses, note recency and drop corrupt entries."""
        self.release()
        self._store._after_reads(self._tenant, self._lookups, self._found, self._corrupt)
        self._lookups, self._found, self._corrupt = 0, [], []


class Store:
    """A byte-bounded LMDB key-value store with pluggable eviction and per-tenant quotas. Thread-safe.

    Each tenant has its own three databases, so one tenant's namespace never reaches another's entries;
    the ``default`` tenant uses the unprefixed ones (stores from before tenancy open unchanged). A tenant
    with a quota evicts only its own entries to stay within it and is never evicted by another tenant's
    writes; the vault budget is kept by evicting among the writer's own entries and those of tenants
    without a quota (lowest rank first).
    """

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
        tenants: Mapping[str, int] | None = None,
        on_damage: OnDamage = "refuse",
    ) -> None:
        if sync_mode not in ("durable", "fast"):
            raise ValueError(f"sync_mode must be 'durable' or 'fast', not {sync_mode!r}")
        self.path = Path(path)
        # locked for this process and checked before LMDB maps the file (files.py says why)
        self._directory = VaultDirectory(self.path, budget=int(max_bytes), on_damage=on_damage)
        self.max_bytes = int(max_bytes)
        self.sync_mode = sync_mode
        self.policy: EvictionPolicy = policy or LRUPolicy()
        self._rank_len = len(self.policy.rank(EntryInfo(clock=0, size=0, priority=0)))
        self._max_map_size = max_map_size or _round_up(4 * self.max_bytes + 1024 * _MIB, _MIB)
        # The map starts at its cap: it is address space, not disk, and growing it later would have to
        # wait for every open read transaction while holding the write lock.
        initial = map_size or self._max_map_size
        self._env = self._directory.open_env(
            map_size=initial,
            max_dbs=1 + 3 * MAX_TENANTS,
            sync=sync_mode == "durable",
            metasync=sync_mode == "durable",
            max_readers=256,
            readahead=False,
        )
        self._meta = self._env.open_db(b"meta")
        self._tenants = self._open_tenants(dict(tenants or {}))
        default = self._tenants[DEFAULT_TENANT]
        self._data, self._index, self._order = default.data, default.index, default.order
        self._write_lock = threading.Lock()
        self._rw = _SharedExclusive()
        self._touch_lock = threading.Lock()
        self._touches: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self.hits = self.misses = self.evictions = self.corrupt = 0
        self._counter_lock = threading.Lock()
        self._clock = self._load_meta()
        self._closed = threading.Event()
        self._maintainer = threading.Thread(
            target=self._maintain, args=(maintenance_interval_s,), name="tierkv-store-maint", daemon=True
        )
        self._maintainer.start()

    # -- bookkeeping -------------------------------------------------------------------------------

    def _open_tenants(self, quotas: dict[str, int]) -> dict[str, _Tenant]:
        """The default tenant, every configured one and every one found in the file (quota-less)."""
        with self._env.begin() as txn:
            found = {
                bytes(k)[: -len(b"/data")].decode(errors="replace")
                for k in txn.cursor().iternext(values=False)
                if bytes(k).endswith(b"/data")
            }
        names = [DEFAULT_TENANT, *sorted((set(quotas) | found) - {DEFAULT_TENANT})]
        if len(names) > MAX_TENANTS:
            raise ValueError(f"at most {MAX_TENANTS} tenants per store, {len(names)} given or found")
        tenants = {}
        for name in names:
            check_tenant(name)
            prefix = b"" if name == DEFAULT_TENANT else name.encode() + b"/"
            data, index, order = (self._env.open_db(prefix + part) for part in (b"data", b"index", b"order"))
            tenants[name] = _Tenant(name, data, index, order, quota=max(0, int(quotas.get(name, 0))))
        return tenants

    def _tenant(self, name: str) -> _Tenant:
        try:
            return self._tenants[name]
        except KeyError:
            raise UnknownTenantError(f"no tenant {name!r} in this store") from None

    @property
    def tenant_names(self) -> list[str]:
        return list(self._tenants)

    def _load_meta(self) -> int:
        """Read the totals (per tenant; the default tenant has what the others do not) and the clock."""
        with self._env.begin(write=True) as txn:
            used = _get_u64(txn, self._meta, b"used")
            count = _get_u64(txn, self._meta, b"count")
            clock = _get_u64(txn, self._meta, b"clock")
            for t in self._tenants.values():
                if t.name != DEFAULT_TENANT:
                    t.used = _get_u64(txn, self._meta, b"used" + t.meta_suffix)
                    t.count = _get_u64(txn, self._meta, b"count" + t.meta_suffix)
                    used, count = used - t.used, count - t.count
            default = self._tenants[DEFAULT_TENANT]
            default.used, default.count = max(0, used), max(0, count)
            stored_policy = txn.get(b"policy", db=self._meta)
            if stored_policy is not None and stored_policy.decode() != self.policy.name:
                log.info(
                    "eviction policy changed from %s to %s: re-ranking",
                    stored_policy.decode(),
                    self.policy.name,
                )
                for t in self._tenants.values():
                    self._rerank(txn, t)
            txn.put(b"policy", self.policy.name.encode(), db=self._meta)
        return clock

    def _rerank(self, txn: lmdb.Transaction, tenant: _Tenant) -> None:
        txn.drop(tenant.order, delete=False)
        with txn.cursor(db=tenant.index) as cur:
            for fkey, raw in cur:
                entry = _Index.unpack(raw)
                txn.put(self._rank(entry) + bytes(fkey), b"", db=tenant.order)

    def _rank(self, entry: _Index) -> bytes:
        return self.policy.rank(EntryInfo(clock=entry.clock, size=entry.charge, priority=entry.priority))

    def _ledger(self) -> _Ledger:
        return _Ledger(self._tenants.values(), self._clock)

    def _save_meta(self, txn: lmdb.Transaction, ledger: _Ledger) -> None:
        txn.put(b"used", _U64.pack(ledger.total), db=self._meta)
        txn.put(b"count", _U64.pack(sum(ledger.count.values())), db=self._meta)
        txn.put(b"clock", _U64.pack(ledger.clock), db=self._meta)
        for t in self._tenants.values():
            if t.name != DEFAULT_TENANT:
                txn.put(b"used" + t.meta_suffix, _U64.pack(ledger.used[t.name]), db=self._meta)
                txn.put(b"count" + t.meta_suffix, _U64.pack(ledger.count[t.name]), db=self._meta)

    def _commit(self, ledger: _Ledger) -> None:
        """Take a committed transaction's figures."""
        self._clock = ledger.clock
        with self._counter_lock:
            for t in self._tenants.values():
                t.used, t.count = ledger.used[t.name], ledger.count[t.name]
                t.evictions += ledger.evicted[t.name]
            self.evictions += sum(ledger.evicted.values())

    # -- writes ------------------------------------------------------------------------------------

    def put_many(
        self,
        namespace: bytes,
        items: Sequence[tuple[bytes, bytes | bytearray | memoryview, int]],
        *,
        tenant: str = DEFAULT_TENANT,
    ) -> PutOutcome:
        """Store ``(key, blob, priority)`` items, evicting as needed to stay in budget.

        The items are written in transactions of at most ``max_bytes / 16``: LMDB reuses the pages a
        transaction frees only two transactions later, so the size of the last few transactions is what
        ``data.mdb`` grows beyond the budget (TROUBLESHOOTING.md, "data.mdb is larger than max_bytes").
        """
        owner = self._tenant(tenant)
        prepared = [(full_key(namespace, key), data, prio) for key, data, prio in items]
        stored = evicted = 0
        rejected: list[int] = []
        with self._write_lock:
            for start, chunk in _chunks(prepared, max(1, self.max_bytes // 16)):
                outcome = self._put_chunk(owner, chunk)
                stored, evicted = stored + outcome.stored, evicted + outcome.evicted
                rejected += [start + i for i in outcome.rejected]
        return PutOutcome(stored=stored, rejected=rejected, evicted=evicted)

    def _put_chunk(
        self, owner: _Tenant, chunk: Sequence[tuple[bytes, bytes | bytearray | memoryview, int]]
    ) -> PutOutcome:
        """One write transaction; a full map grows, a full disk gets one retry once freed pages are free."""
        retried_disk = False
        for _attempt in range(6):
            try:
                with self._rw.shared():
                    return self._put_txn(owner, chunk)
            except lmdb.MapFullError:
                self._grow_map()
            except DiskFullError:
                if retried_disk:
                    raise
                retried_disk = True
                self._release_freed_pages()
        raise StoreFullError("LMDB map is full and cannot grow further")

    def _release_freed_pages(self) -> None:
        """Commit one tiny transaction: pages that transaction N freed (deletes, evictions) are reusable
        from transaction N+2 on, so on a full disk this lets the next write use them."""
        with contextlib.suppress(lmdb.Error), self._rw.shared(), self._env.begin(write=True) as txn:
            txn.put(b"clock", _U64.pack(self._clock), db=self._meta)

    def _put_txn(
        self, owner: _Tenant, items: Sequence[tuple[bytes, bytes | bytearray | memoryview, int]]
    ) -> PutOutcome:
        ledger = self._ledger()
        rejected: list[int] = []
        try:
            with self._env.begin(write=True) as txn:
                ledger.clock = self._apply_touches(txn, ledger.clock)
                for i, (fkey, data, priority) in enumerate(items):
                    if not self._put_one(txn, ledger, owner, (fkey, data, priority)):
                        rejected.append(i)
                self._save_meta(txn, ledger)
        except lmdb.MapFullError:
            raise
        except lmdb.Error as exc:
            full = disk_full_message(self.path, exc, sum(len(data) for _, data, _ in items))
            raise (DiskFullError(full) if full else StoreFullError(f"LMDB write failed: {exc}")) from exc
        self._commit(ledger)
        evicted = sum(ledger.evicted.values())
        return PutOutcome(stored=len(items) - len(rejected), rejected=rejected, evicted=evicted)

    def _put_one(
        self,
        txn: lmdb.Transaction,
        ledger: _Ledger,
        owner: _Tenant,
        item: tuple[bytes, bytes | bytearray | memoryview, int],
    ) -> bool:
        """Write one entry after making room for it; False when it cannot fit (the item is rejected)."""
        fkey, data, priority = item
        charge = len(fkey) - 1 + len(data)
        if charge > min(self.max_bytes, owner.quota or self.max_bytes):
            return False
        old = self._drop(txn, owner, fkey)
        if old is not None:
            ledger.remove(owner.name, old)
        if not self._make_room(txn, ledger, owner, charge):
            return False
        ledger.clock += 1
        entry = _Index(charge, ledger.clock, priority, checksum(fkey, data))
        txn.put(fkey, data, db=owner.data)
        txn.put(fkey, entry.pack(), db=owner.index)
        txn.put(self._rank(entry) + fkey, b"", db=owner.order)
        ledger.add(owner.name, charge)
        return True

    def _make_room(self, txn: lmdb.Transaction, ledger: _Ledger, owner: _Tenant, charge: int) -> bool:
        """Evict until ``charge`` more bytes fit the owner's quota and the vault budget."""
        while owner.quota and ledger.used[owner.name] + charge > owner.quota:
            if not self._evict_lowest(txn, ledger, owner):
                return False
        while ledger.total + charge > self.max_bytes:
            victim = self._victim(txn, owner)
            if victim is None or not self._evict_lowest(txn, ledger, victim):
                return False
        return True

    def _victim(self, txn: lmdb.Transaction, owner: _Tenant) -> _Tenant | None:
        """Whose lowest-ranked entry goes: the owner's or a quota-less tenant's, whichever ranks lower."""
        candidates = [owner, *(t for t in self._tenants.values() if t is not owner and not t.quota)]
        if len(candidates) == 1:
            return owner
        best: tuple[bytes, _Tenant] | None = None
        for t in candidates:
            with txn.cursor(db=t.order) as cur:
                if cur.first():
                    rank = bytes(cur.key()[: self._rank_len])
                    if best is None or rank < best[0]:
                        best = (rank, t)
        return None if best is None else best[1]

    def _evict_lowest(self, txn: lmdb.Transaction, ledger: _Ledger, tenant: _Tenant) -> bool:
        """Drop the tenant's lowest-ranked entry; False when it has none."""
        with txn.cursor(db=tenant.order) as order:
            if not order.first():
                return False
            victim_fkey = bytes(order.key()[self._rank_len :])
            order.delete()
        victim_raw = txn.get(victim_fkey, db=tenant.index)
        if victim_raw is not None:
            victim = _Index.unpack(victim_raw)
            txn.delete(victim_fkey, db=tenant.index)
            txn.delete(victim_fkey, db=tenant.data)
            ledger.remove(tenant.name, victim.charge)
            ledger.evicted[tenant.name] += 1
        return True

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

    def delete(self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = DEFAULT_TENANT) -> int:
        owner = self._tenant(tenant)
        return self._delete_entries(owner, lambda _txn: [full_key(namespace, k) for k in keys])

    def flush(self, namespace: bytes = b"", *, tenant: str | None = None) -> int:
        """Delete every entry of ``namespace`` in ``tenant`` (default tenant when None); with no
        namespace, every entry of ``tenant``, or of every tenant when None."""
        if namespace:
            owner = self._tenant(tenant or DEFAULT_TENANT)
            prefix = full_key(namespace, b"")
            deleted = self._delete_entries(owner, lambda txn: self._keys_with_prefix(txn, owner, prefix))
        else:
            deleted = self._drop_tenants(
                list(self._tenants.values()) if tenant is None else [self._tenant(tenant)]
            )
        with self._touch_lock:
            self._touches.clear()
        return deleted

    def _drop_tenants(self, targets: Sequence[_Tenant]) -> int:
        with self._write_lock, self._rw.shared():
            ledger = self._ledger()
            deleted = 0
            with self._env.begin(write=True) as txn:
                for t in targets:
                    for db in (t.data, t.index, t.order):
                        txn.drop(db, delete=False)
                    deleted += ledger.clear(t.name)
                self._save_meta(txn, ledger)
            self._commit(ledger)
        return deleted

    def _keys_with_prefix(self, txn: lmdb.Transaction, owner: _Tenant, prefix: bytes) -> list[bytes]:
        found: list[bytes] = []
        with txn.cursor(db=owner.index) as cur:
            if cur.set_range(prefix):
                for fkey in cur.iternext(keys=True, values=False):
                    if not bytes(fkey).startswith(prefix):
                        break
                    found.append(bytes(fkey))
        return found

    def _delete_entries(self, owner: _Tenant, select: Callable[[lmdb.Transaction], Sequence[bytes]]) -> int:
        """Drop the entries ``select`` names, in one write transaction with the new totals."""
        with self._write_lock, self._rw.shared():
            ledger = self._ledger()
            deleted = 0
            with self._env.begin(write=True) as txn:
                for fkey in select(txn):
                    charge = self._drop(txn, owner, fkey)
                    if charge is not None:
                        ledger.remove(owner.name, charge)
                        deleted += 1
                self._save_meta(txn, ledger)
            self._commit(ledger)
        return deleted

    def _drop(self, txn: lmdb.Transaction, owner: _Tenant, fkey: bytes) -> int | None:
        raw = txn.get(fkey, db=owner.index)
        if raw is None:
            return None
        entry = _Index.unpack(raw)
        txn.delete(self._rank(entry) + fkey, db=owner.order)
        txn.delete(fkey, db=owner.index)
        txn.delete(fkey, db=owner.data)
        return entry.charge

    # -- reads -------------------------------------------------------------------------------------

    def reader(self, tenant: str = DEFAULT_TENANT) -> Reader:
        """Reads of ``tenant``'s entries; the caller must :meth:`Reader.close` it."""
        return Reader(self, self._tenant(tenant))

    @contextlib.contextmanager
    def view_many(
        self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = DEFAULT_TENANT
    ) -> Iterator[list[tuple[Lookup, memoryview | None]]]:
        """Zero-copy, checksum-verified views of the blobs, valid only inside the ``with`` block.

        Keep the block short: an open read transaction pins LMDB pages.
        """
        reader = self.reader(tenant)
        try:
            yield [reader.get(namespace, k) for k in keys]
        finally:
            reader.close()

    def _after_reads(self, owner: _Tenant, lookups: int, found: list[bytes], corrupt: list[bytes]) -> None:
        with self._counter_lock:
            for who in (self, owner):
                who.hits += len(found)
                who.misses += lookups - len(found)
                who.corrupt += len(corrupt)
        self._touch(owner, found)
        if corrupt:
            log.warning("dropping %d corrupt entries", len(corrupt))
            self._delete_entries(owner, lambda _txn: corrupt)

    def get_many(
        self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = DEFAULT_TENANT
    ) -> list[bytes | None]:
        """Copying convenience over :meth:`view_many`: None for missing or corrupt."""
        with self.view_many(namespace, keys, tenant=tenant) as views:
            return [bytes(v) if v is not None else None for _, v in views]

    def prefix_lookup(self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = DEFAULT_TENANT) -> int:
        """How many leading keys are present (not verified: the BatchGet that follows verifies)."""
        owner = self._tenant(tenant)
        present: list[bytes] = []
        with self._rw.shared(), self._env.begin(buffers=True) as txn:
            for key in keys:
                fkey = full_key(namespace, key)
                if txn.get(fkey, db=owner.index) is None:
                    break
                present.append(fkey)
        self._touch(owner, present)
        return len(present)

    # -- recency -----------------------------------------------------------------------------------

    def _touch(self, owner: _Tenant, fkeys: Sequence[bytes]) -> None:
        if not fkeys:
            return
        with self._touch_lock:
            for fkey in fkeys:
                self._touches[(owner.name, fkey)] = None
                self._touches.move_to_end((owner.name, fkey))
            while len(self._touches) > _MAX_TOUCHES:
                self._touches.popitem(last=False)

    def _apply_touches(self, txn: lmdb.Transaction, clock: int) -> int:
        with self._touch_lock:
            touched, self._touches = self._touches, OrderedDict()
        for name, fkey in touched:
            owner = self._tenants[name]
            raw = txn.get(fkey, db=owner.index)
            if raw is None:
                continue
            entry = _Index.unpack(raw)
            txn.delete(self._rank(entry) + fkey, db=owner.order)
            clock += 1
            entry.clock = clock
            txn.put(fkey, entry.pack(), db=owner.index)
            txn.put(self._rank(entry) + fkey, b"", db=owner.order)
        return clock

    def apply_touches(self) -> None:
        """Write pending recency updates now (the maintenance thread does this every interval)."""
        with self._touch_lock:
            if not self._touches:
                return
        with self._write_lock, self._rw.shared():
            ledger = self._ledger()
            with self._env.begin(write=True) as txn:
                ledger.clock = self._apply_touches(txn, ledger.clock)
                self._save_meta(txn, ledger)
            self._commit(ledger)

    def _maintain(self, interval: float) -> None:
        while not self._closed.wait(interval):
            try:
                self.apply_touches()
                if self.sync_mode == "fast":
                    self._env.sync(True)
            except Exception:
                log.exception("store maintenance failed")

    # -- lifecycle ---------------------------------------------------------------------------------

    def stats(self, tenant: str | None = None) -> StoreStats:
        """The whole store's figures, or one tenant's (its quota, when it has one, as ``max_bytes``)."""
        map_size = self._env.info()["map_size"]
        with self._counter_lock:
            if tenant is None:
                keys = sum(t.count for t in self._tenants.values())
                used = sum(t.used for t in self._tenants.values())
                who: Store | _Tenant = self
                limit = self.max_bytes
            else:
                who = self._tenant(tenant)
                keys, used, limit = who.count, who.used, min(self.max_bytes, who.quota or self.max_bytes)
            return StoreStats(
                keys=keys,
                used_bytes=used,
                max_bytes=limit,
                hits=who.hits,
                misses=who.misses,
                evictions=who.evictions,
                corrupt=who.corrupt,
                map_size=map_size,
            )

    def tenant_usage(self) -> list[TenantUsage]:
        with self._counter_lock:
            return [
                TenantUsage(t.name, t.count, t.used, t.quota, t.evictions) for t in self._tenants.values()
            ]

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
            self._directory.release()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _get_u64(txn: lmdb.Transaction, db: Any, key: bytes) -> int:
    raw = txn.get(key, db=db)
    return 0 if raw is None else int(_U64.unpack(raw)[0])


def _chunks(items: Sequence[Any], limit: int) -> Iterator[tuple[int, Sequence[Any]]]:
    """``(start, run)`` of consecutive items whose blobs total at most ``limit`` bytes (at least one)."""
    start, size = 0, 0
    for i, (_, data, _) in enumerate(items):
        if i > start and size + len(data) > limit:
            yield start, items[start:i]
            start, size = i, 0
        size += len(data)
    if start < len(items):
        yield start, items[start:]


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step
