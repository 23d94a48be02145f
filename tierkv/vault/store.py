"""The vault's storage engine: LMDB, bounded in bytes, checksummed, crash-consistent.

Four LMDB databases live in one environment:

``data``   full key → the blob, exactly as the client sent it (no framing, no copy on the way in)
``index``  full key → charge (u64), clock (u64), priority (u16), xxh3-64 checksum (u64), and for an entry
           stored with retention metadata a tail (:class:`~tierkv.vault.entrymeta.EntryMeta`)
``order``  policy rank + full key → empty; the eviction order, lowest first (protected entries are not
           in it: eviction never sees them)
``expiry`` expiry time (ms) + full key → empty; entries with a time to live, soonest first
``tokens`` full key → the block's token ids (little-endian int32), for entries stored with them (warm
           starts, :mod:`tierkv.vault.hottest`); apart from the index so that the records eviction and
           scans read stay small, and written, replaced and deleted with the entry in its transaction
``meta``   bookkeeping: used bytes, entry count, logical clock, policy name

A full key is ``len(namespace) ‖ namespace ‖ key``. An entry is charged ``len(namespace) + len(key) +
len(blob)`` (+ its token ids' bytes) against ``max_bytes``. A Put batch is written in write transactions
of at most ``max_bytes / 16`` bytes (one for most batches); each makes its own room by evicting from the
front of ``order`` before each write and stores the new totals in ``meta`` in the same transaction: the
budget holds at every commit and the accounting is exactly as durable as the data.


Reads never open a write transaction: a hit is recorded in memory and the new recency is written by the
next Put or by the maintenance thread (so recency is approximate by at most one maintenance interval).
Every read verifies the checksum (seeded with the full key, so a blob can't be served under another key);
a mismatch is reported as CORRUPT, counted and the entry dropped.

Retention (README, "Retention"): an entry past its time to live reads as a miss (counted as expired) and is
the first to go when room is needed (the maintenance thread also clears them); a protected entry is kept
out of the eviction order while the tenant's protected bytes fit under ``max_protected_fraction`` of its
quota (or of the budget) and all tenants' under that fraction of the budget — past it, the store is kept
unprotected, counted and logged. A stored child with a parent key counts once in its parent's sharing.

Lookup leases (:mod:`tierkv.vault.leases`): eviction walks past entries a recent PrefixLookup leased (at
most as many as the tenant holds); when nothing unleased is left the put is refused as on a full store,
so the budget holds exactly. Deletes and flushes ignore leases.
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

from tierkv.limits import check_namespace
from tierkv.retention.classes import BlockMeta, pack_tokens
from tierkv.vault.entrymeta import ClassBook, ClassUsage, EntryMeta, Ghosts, expiry_of
from tierkv.vault.files import OnDamage, VaultDirectory, disk_full_message
from tierkv.vault.leases import LeaseCounts, LeaseTable
from tierkv.vault.policy import ContextPolicy, EntryInfo, EvictionPolicy, LRUPolicy

log = logging.getLogger(__name__)

_INDEX = struct.Struct("<QQHQ")
_U64 = struct.Struct("<Q")
_BE64 = struct.Struct(">Q")
_MIB = 1024 * 1024
_MAX_TOUCHES = 200_000
_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_TENANT = "default"
MAX_TENANTS = 64
READ_TXN_MAX_S = 0.5
"""A reader in the middle of a reply ends its read transaction after this long (and reopens one)."""
PURGE_BATCH = 10_000
"""The maintenance thread drops at most this many expired entries per tenant per interval."""
OVERFLOW_LOG_INTERVAL_S = 60.0
HEAD_BYTES = 320
"""How much of a blob inspection returns: enough for a tierkv blob header (at most 312 bytes)."""
SCAN_SLICE = 10_000
"""Listing namespaces reads the index in read transactions of at most this many entries, so a large store
never holds one read transaction for long."""
Item = tuple[bytes, bytes | bytearray | memoryview, int]
_Prepared = tuple[bytes, bytes | bytearray | memoryview, int, BlockMeta | None]


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
    expired: int = 0
    protected_bytes: int = 0
    protected_overflow: int = 0
    leases: LeaseCounts = LeaseCounts()


@dataclasses.dataclass(slots=True)
class _Index:
    charge: int
    clock: int
    priority: int
    checksum: int
    ext: EntryMeta | None = None

    @classmethod
    def unpack(cls, raw: bytes | memoryview) -> _Index:
        """ValueError (struct.error is one) when ``raw`` is no index record."""
        if len(raw) == _INDEX.size:
            return cls(*_INDEX.unpack(raw))
        if len(raw) < _INDEX.size:
            raise ValueError("index record too short")
        charge, clock, priority, check = _INDEX.unpack_from(raw)
        return cls(charge, clock, priority, check, EntryMeta.unpack(raw[_INDEX.size :]))

    def pack(self) -> bytes:
        base = _INDEX.pack(self.charge, self.clock, self.priority, self.checksum)
        return base if self.ext is None else base + self.ext.pack()

    @property
    def protected(self) -> bool:
        return self.ext is not None and self.ext.protected

    @property
    def source(self) -> str:
        return "" if self.ext is None else self.ext.source


def full_key(namespace: bytes, key: bytes) -> bytes:
    return bytes((len(check_namespace(namespace)),)) + namespace + key


def split_full_key(fkey: bytes) -> tuple[bytes, bytes]:
    """(namespace, key) of a full key: the inverse of :func:`full_key`."""
    n = fkey[0]
    return fkey[1 : 1 + n], fkey[1 + n :]


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
    expiry: Any
    tokens: Any = None
    quota: int = 0
    used: int = 0
    count: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    corrupt: int = 0
    expired: int = 0
    overflow: int = 0
    protected: int = 0
    classes: Counter[str] = dataclasses.field(default_factory=Counter)
    """Committed bytes per tagged source class (untagged bytes are ``used`` minus their sum)."""
    class_keys: Counter[str] = dataclasses.field(default_factory=Counter)
    class_protected: Counter[str] = dataclasses.field(default_factory=Counter)

    @property
    def meta_suffix(self) -> bytes:
        return b"/" + self.name.encode()


@dataclasses.dataclass(frozen=True, slots=True)
class ChainEntry:
    """One entry as a warm start sees it: its key, its parent's, its decayed hits, recency and class."""

    key: bytes
    parent: bytes
    hits: float
    clock: int
    source: str


@dataclasses.dataclass(frozen=True)
class TenantUsage:
    """One tenant's figures; field for field the proto's ``TenantStats``."""

    tenant: str
    keys: int
    used_bytes: int
    quota_bytes: int
    evictions: int
    protected_bytes: int = 0
    protected_overflow: int = 0
    expired: int = 0


@dataclasses.dataclass
class NamespaceUsage:
    """One namespace of one tenant: entries, charged bytes, protected bytes, and its first key with the
    head of that key's blob (what kind of blocks the namespace holds)."""

    tenant: str
    namespace: bytes
    keys: int = 0
    used_bytes: int = 0
    protected_bytes: int = 0
    sample_key: bytes = b""
    head: bytes = b""


@dataclasses.dataclass(frozen=True)
class EntryReport:
    """What the store holds under one key, read without counting a hit: the blob's size and head, its
    charge and priority, and its retention record (None: it has none). ``meta.hits`` is the decayed count
    now, reads not yet written to disk included."""

    status: Lookup
    size: int = 0
    charge: int = 0
    priority: int = 0
    head: bytes = b""
    meta: EntryMeta | None = None


class _NamespaceScan:
    """Adds up one tenant's index, namespace by namespace, a slice of entries per read transaction."""

    def __init__(self, tenant: _Tenant, found: list[NamespaceUsage], limit: int) -> None:
        self.tenant = tenant
        self.found = found
        self.limit = limit
        self.truncated = False

    def slice(self, txn: lmdb.Transaction, start: bytes) -> bytes | None:
        """Count up to :data:`SCAN_SLICE` entries from ``start`` on; the full key to go on from, or None
        at the end (or past the limit)."""
        with txn.cursor(db=self.tenant.index) as cur:
            if not cur.set_range(start):
                return None
            for n, (fkey, raw) in enumerate(cur.iternext()):
                if n >= SCAN_SLICE:
                    return bytes(fkey)
                if fkey and not self._count(txn, bytes(fkey), raw):
                    self.truncated = True
                    return None
        return None

    def _count(self, txn: lmdb.Transaction, fkey: bytes, raw: bytes | memoryview) -> bool:
        namespace, key = split_full_key(fkey)
        last = self.found[-1] if self.found else None
        if last is None or last.tenant != self.tenant.name or last.namespace != namespace:
            if len(self.found) >= self.limit:
                return False
            data = txn.get(fkey, db=self.tenant.data)
            head = b"" if data is None else bytes(data[:HEAD_BYTES])
            last = NamespaceUsage(self.tenant.name, namespace, sample_key=key, head=head)
            self.found.append(last)
        entry = _unpack_lenient(raw)
        last.keys += 1
        last.used_bytes += entry.charge
        last.protected_bytes += entry.charge if entry.protected else 0
        return True


class _Ledger:
    """Usage figures inside one write transaction; the store takes them only once it has committed."""

    def __init__(self, tenants: Iterable[_Tenant], clock: int, now: float) -> None:
        tenants = list(tenants)
        self.clock = clock
        self.now = now
        self.used = {t.name: t.used for t in tenants}
        self.count = {t.name: t.count for t in tenants}
        self.protected = {t.name: t.protected for t in tenants}
        self.classes = {t.name: Counter(t.classes) for t in tenants}
        self.class_keys = {t.name: Counter(t.class_keys) for t in tenants}
        self.class_protected = {t.name: Counter(t.class_protected) for t in tenants}
        self.total = sum(self.used.values())
        self.population = sum(self.count.values())
        self.evicted: Counter[str] = Counter()
        self.overflow: Counter[str] = Counter()
        self.ghosts: list[tuple[str, bytes, str]] = []
        self.dropped: list[tuple[str, bytes]] = []
        self.past_leases: dict[str, bytes] = {}
        """Per tenant, the order key eviction reached after walking past leased entries in this
        transaction: the next eviction starts there instead of walking past them again."""

    @property
    def protected_total(self) -> int:
        return sum(self.protected.values())

    def add(self, tenant: str, entry: _Index) -> None:
        self._apply(tenant, entry, 1)

    def remove(self, tenant: str, entry: _Index) -> None:
        self._apply(tenant, entry, -1)

    def _apply(self, tenant: str, entry: _Index, sign: int) -> None:
        charge = sign * entry.charge
        self.used[tenant] += charge
        self.count[tenant] += sign
        self.population += sign
        self.total += charge
        self.count_retention(tenant, entry, sign)

    def count_retention(self, tenant: str, entry: _Index, sign: int = 1) -> None:
        """Only the per-class and protected figures an entry's retention record adds (or takes away)."""
        charge = sign * entry.charge
        if entry.ext is None:
            return
        if entry.ext.source:
            self.classes[tenant][entry.ext.source] += charge
            self.class_keys[tenant][entry.ext.source] += sign
        if entry.ext.protected:
            self.protected[tenant] += charge
            self.class_protected[tenant][entry.ext.source] += charge

    def clear(self, tenant: str) -> int:
        self.total -= self.used[tenant]
        self.population -= self.count[tenant]
        dropped, self.used[tenant], self.count[tenant] = self.count[tenant], 0, 0
        self.protected[tenant] = 0
        for book in (self.classes, self.class_keys, self.class_protected):
            book[tenant] = Counter()
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
        self._now = store.now()
        self.tally = ReadTally()

    @property
    def stale(self) -> bool:
        """The open transaction is old or a map resize waits for it."""
        return self._txn is not None and (
            time.monotonic() - self._opened > READ_TXN_MAX_S or self._store._rw.exclusive_waiting
        )

    def get(self, namespace: bytes, key: bytes) -> tuple[Lookup, memoryview | None]:
        fkey = full_key(namespace, key)
        txn = self._begin()
        tally = self.tally
        tally.lookups += 1
        raw = txn.get(fkey, db=self._tenant.index)
        if raw is None:
            tally.missing.append(fkey)
            return Lookup.MISSING, None
        data = txn.get(fkey, db=self._tenant.data)
        try:
            entry = _Index.unpack(raw)
        except ValueError:
            entry = None
        if data is None or entry is None or checksum(fkey, data) != entry.checksum:
            tally.corrupt.append(fkey)
            return Lookup.CORRUPT, None
        if entry.ext is not None and entry.ext.expired(self._now):
            tally.expired[entry.ext.source] += 1
            return Lookup.MISSING, None
        tally.found.append(fkey)
        tally.hits[entry.source] += 1
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
        tally, self.tally = self.tally, ReadTally()
        self._store._after_reads(self._tenant, tally)


@dataclasses.dataclass
class ReadTally:
    """What one reader saw: found, missing, corrupt keys and, per source class, hits and expired reads."""

    lookups: int = 0
    found: list[bytes] = dataclasses.field(default_factory=list)
    missing: list[bytes] = dataclasses.field(default_factory=list)
    corrupt: list[bytes] = dataclasses.field(default_factory=list)
    hits: Counter[str] = dataclasses.field(default_factory=Counter)
    expired: Counter[str] = dataclasses.field(default_factory=Counter)


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
        max_protected_fraction: float = 0.5,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock`` (seconds) replaces both the wall clock that times to live are measured on (and
        stored in) and the monotonic clock of leases, so tests move time instead of sleeping; set the
        maintenance interval high then, or the maintenance thread runs on its own schedule."""
        if sync_mode not in ("durable", "fast"):
            raise ValueError(f"sync_mode must be 'durable' or 'fast', not {sync_mode!r}")
        self.now: Callable[[], float] = clock or time.time
        self.path = Path(path)
        # locked for this process and checked before LMDB maps the file (files.py says why)
        self._directory = VaultDirectory(self.path, budget=int(max_bytes), on_damage=on_damage)
        self.max_bytes = int(max_bytes)
        self.sync_mode = sync_mode
        self.policy: EvictionPolicy = policy or LRUPolicy()
        self._rank_len = len(self.policy.rank(EntryInfo(clock=0, size=0, priority=0)))
        if not 0.0 <= max_protected_fraction <= 1.0:
            raise ValueError(f"max_protected_fraction must be in [0, 1], got {max_protected_fraction!r}")
        self.max_protected_fraction = max_protected_fraction
        self._max_map_size = max_map_size or _round_up(4 * self.max_bytes + 1024 * _MIB, _MIB)
        # The map starts at its cap: it is address space, not disk, and growing it later would have to
        # wait for every open read transaction while holding the write lock.
        initial = map_size or self._max_map_size
        self._env = self._directory.open_env(
            map_size=initial,
            max_dbs=1 + 5 * MAX_TENANTS,
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
        self._touches: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self._counter_lock = threading.Lock()
        self.classes = ClassBook()
        self._ghosts = Ghosts()
        self.on_drop: Callable[[Sequence[tuple[str, bytes]]], None] | None = None
        """Told (tenant, full key) of every entry a committed transaction removed (prefetch hints)."""
        self._overflow_logged = 0.0
        self._leases = LeaseTable(self.max_bytes, clock=clock or time.monotonic)
        self._clock = self._load_meta()
        self._load_retention()
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
            data, index, order, expiry, tokens = (
                self._env.open_db(prefix + part)
                for part in (b"data", b"index", b"order", b"expiry", b"tokens")
            )

            quota = max(0, int(quotas.get(name, 0)))
            tenants[name] = _Tenant(name, data, index, order, expiry, tokens, quota=quota)
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
                if not entry.protected:
                    txn.put(self._rank(entry) + bytes(fkey), b"", db=tenant.order)

    def _load_retention(self) -> None:
        """Protected and per-class bytes of every tenant, from the index (what an entry's tail says)."""
        ledger = self._ledger()
        with self._env.begin(buffers=True) as txn:
            for t in self._tenants.values():
                with txn.cursor(db=t.index) as cur:
                    for raw in cur.iternext(keys=False, values=True):
                        if len(raw) <= _INDEX.size:
                            continue
                        with contextlib.suppress(ValueError):
                            ledger.count_retention(t.name, _Index.unpack(raw))
        self._commit(ledger)

    def _rank(self, entry: _Index) -> bytes:
        ext = entry.ext
        if ext is None:
            return self.policy.rank(EntryInfo(clock=entry.clock, size=entry.charge, priority=entry.priority))
        info = EntryInfo(
            clock=entry.clock,
            size=entry.charge,
            priority=entry.priority,
            importance=ext.importance,
            hits=ext.hits,
            sharing=ext.sharing,
            population=ext.population,
        )
        return self.policy.rank(info)

    def _ledger(self) -> _Ledger:
        return _Ledger(self._tenants.values(), self._clock, self.now())

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
                t.overflow += ledger.overflow[t.name]
                t.protected = ledger.protected[t.name]
                t.classes = +ledger.classes[t.name]
                t.class_keys = +ledger.class_keys[t.name]
                t.class_protected = +ledger.class_protected[t.name]
        if ledger.ghosts:
            self._ghosts.add(ledger.ghosts)
        if ledger.dropped and self.on_drop is not None:
            self.on_drop(ledger.dropped)
        if ledger.overflow:
            self._log_overflow(ledger.overflow)

    def _log_overflow(self, overflow: Counter[str]) -> None:
        now = time.monotonic()
        if now - self._overflow_logged >= OVERFLOW_LOG_INTERVAL_S:
            self._overflow_logged = now
            shown = ", ".join(f"{n} for tenant {t}" for t, n in overflow.items())
            log.warning(
                "protected bytes at the cap (max_protected_fraction = %s): stored unprotected: %s "
                "(further ones are only counted for %.0f s)",
                self.max_protected_fraction,
                shown,
                OVERFLOW_LOG_INTERVAL_S,
            )

    # -- writes ------------------------------------------------------------------------------------

    def put_many(
        self,
        namespace: bytes,
        items: Sequence[Item],
        *,
        tenant: str = DEFAULT_TENANT,
        metas: Sequence[BlockMeta | None] | None = None,
    ) -> PutOutcome:
        """Store ``(key, blob, priority)`` items, evicting as needed to stay in budget. ``metas`` (aligned
        with ``items``, None for an untagged one) is each blob's retention metadata.

        The items are written in transactions of at most ``max_bytes / 16``: LMDB reuses the pages a
        transaction frees only two transactions later, so the size of the last few transactions is what
        ``data.mdb`` grows beyond the budget (TROUBLESHOOTING.md, "data.mdb is larger than max_bytes").
        """
        owner = self._tenant(tenant)
        if metas is not None and len(metas) != len(items):
            raise ValueError("metas must be aligned with items")
        prepared: list[_Prepared] = [
            (full_key(namespace, key), data, prio, None if metas is None else metas[i])
            for i, (key, data, prio) in enumerate(items)
        ]
        stored = evicted = 0
        rejected: list[int] = []
        with self._write_lock:
            for start, chunk in _chunks(prepared, max(1, self.max_bytes // 16)):
                outcome = self._put_chunk(owner, chunk)
                stored, evicted = stored + outcome.stored, evicted + outcome.evicted
                rejected += [start + i for i in outcome.rejected]
        return PutOutcome(stored=stored, rejected=rejected, evicted=evicted)

    def _put_chunk(self, owner: _Tenant, chunk: Sequence[_Prepared]) -> PutOutcome:
        """One write transaction; a full map grows, a full disk gets one retry once freed pages are free."""
        retried_disk = False
        for _attempt in range(6):
            try:
                with self._rw.shared(), self._leases.writing():
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

    def _put_txn(self, owner: _Tenant, items: Sequence[_Prepared]) -> PutOutcome:
        ledger = self._ledger()
        rejected: list[int] = []
        try:
            with self._env.begin(write=True) as txn:
                self._apply_touches(txn, ledger)
                for i, item in enumerate(items):
                    if not self._put_one(txn, ledger, owner, item):
                        rejected.append(i)
                self._save_meta(txn, ledger)
        except lmdb.MapFullError:
            raise
        except lmdb.Error as exc:
            full = disk_full_message(self.path, exc, sum(len(item[1]) for item in items))
            raise (DiskFullError(full) if full else StoreFullError(f"LMDB write failed: {exc}")) from exc
        self._commit(ledger)
        evicted = sum(ledger.evicted.values())
        return PutOutcome(stored=len(items) - len(rejected), rejected=rejected, evicted=evicted)

    def _put_one(self, txn: lmdb.Transaction, ledger: _Ledger, owner: _Tenant, item: _Prepared) -> bool:
        """Write one entry after making room for it; False when it cannot fit (the item is rejected)."""
        fkey, data, priority, meta = item
        tokens = pack_tokens(meta.tokens) if meta is not None and meta.tokens else b""
        charge = len(fkey) - 1 + len(data) + len(tokens)
        if charge > min(self.max_bytes, owner.quota or self.max_bytes):
            return False
        old = self._drop(txn, ledger, owner, fkey)
        if not self._make_room(txn, ledger, owner, charge):
            return False
        ledger.clock += 1
        entry = _Index(charge, ledger.clock, priority, checksum(fkey, data))
        entry.ext = self._entry_meta(ledger, owner, charge, meta, old)
        txn.put(fkey, data, db=owner.data)
        if tokens:
            txn.put(fkey, tokens, db=owner.tokens)
        self._write_index(txn, ledger, owner, fkey, entry)
        if entry.ext is not None and entry.ext.expiry:
            txn.put(_expiry_key(entry.ext.expiry, fkey), b"", db=owner.expiry)
        ledger.add(owner.name, entry)
        if entry.ext is not None and entry.ext.parent:
            self._adjust_sharing(txn, ledger, owner, _parent_key(fkey, entry.ext.parent), 1)
        return True

    def _entry_meta(
        self, ledger: _Ledger, owner: _Tenant, charge: int, meta: BlockMeta | None, old: _Index | None
    ) -> EntryMeta | None:
        """The tail of a new entry: its metadata (protected only within the caps), hits and children it
        had under the same key, or None for an untagged entry with nothing to carry."""
        kept = old.ext if old is not None else None
        if meta is None:
            if kept is None or not (kept.hits or kept.sharing):
                return None
            return EntryMeta(hits=kept.hits, sharing=kept.sharing)
        ext = EntryMeta(
            expiry=ledger.now + meta.ttl_s if meta.ttl_s else 0.0,
            importance=meta.importance,
            hits=kept.hits if kept else 0.0,
            sharing=kept.sharing if kept else 0,
            source=meta.source,
            parent=meta.parent,
        )
        if meta.protected:
            ext.protected = self._protected_fits(ledger, owner, charge)
            if not ext.protected:
                ledger.overflow[owner.name] += 1
        return ext

    def _protected_fits(self, ledger: _Ledger, owner: _Tenant, charge: int) -> bool:
        """``charge`` more protected bytes stay under the tenant's cap and the vault's."""
        fraction = self.max_protected_fraction
        tenant_cap = fraction * min(self.max_bytes, owner.quota or self.max_bytes)
        return (
            ledger.protected[owner.name] + charge <= tenant_cap
            and ledger.protected_total + charge <= fraction * self.max_bytes
        )

    def _write_index(
        self, txn: lmdb.Transaction, ledger: _Ledger, owner: _Tenant, fkey: bytes, entry: _Index
    ) -> None:
        """Write the index record and (unless protected) its order key, ranked at today's population;
        the caller has deleted the entry's previous order key."""
        if entry.ext is None and self.policy.uses_meta:
            entry.ext = EntryMeta()
        if entry.ext is not None:
            entry.ext.population = max(1, ledger.population)
        txn.put(fkey, entry.pack(), db=owner.index)
        if not entry.protected:
            txn.put(self._rank(entry) + fkey, b"", db=owner.order)

    def _adjust_sharing(
        self, txn: lmdb.Transaction, ledger: _Ledger, owner: _Tenant, parent: bytes, delta: int
    ) -> None:
        """A stored child of ``parent`` came or went: count it in the parent (if stored) and re-rank it."""
        entry = self._unranked(txn, owner, parent)
        if entry is None:
            return
        entry.ext = entry.ext or EntryMeta()
        entry.ext.sharing = max(0, entry.ext.sharing + delta)
        self._write_index(txn, ledger, owner, parent, entry)

    def _unranked(self, txn: lmdb.Transaction, owner: _Tenant, fkey: bytes) -> _Index | None:
        """A stored entry taken out of the eviction order, to be changed and written back with
        :meth:`_write_index`; None when it is missing or its record is unreadable."""
        raw = txn.get(fkey, db=owner.index)
        if raw is None:
            return None
        try:
            entry = _Index.unpack(raw)
        except ValueError:
            return None
        if not entry.protected:
            txn.delete(self._rank(entry) + fkey, db=owner.order)
        return entry

    def _make_room(self, txn: lmdb.Transaction, ledger: _Ledger, owner: _Tenant, charge: int) -> bool:
        """Evict until ``charge`` more bytes fit the owner's quota and the vault budget."""
        while owner.quota and ledger.used[owner.name] + charge > owner.quota:
            if not self._evict_one(txn, ledger, owner):
                return False
        while ledger.total + charge > self.max_bytes:
            victim = self._victim(txn, ledger, owner)
            if victim is None or not self._evict_one(txn, ledger, victim):
                return False
        return True

    def _victim(self, txn: lmdb.Transaction, ledger: _Ledger, owner: _Tenant) -> _Tenant | None:
        """Whose entry goes: the owner's or a quota-less tenant's — one with an expired entry first, else
        whichever's lowest-ranked entry ranks lower."""
        candidates = [owner, *(t for t in self._tenants.values() if t is not owner and not t.quota)]
        if len(candidates) == 1:
            return owner
        best: tuple[bytes, _Tenant] | None = None
        for t in candidates:
            if self._first_expired(txn, t, ledger.now) is not None:
                return t
            with txn.cursor(db=t.order) as cur:
                if self._first_evictable(cur, ledger, t, self._unleased):
                    rank = bytes(cur.key()[: self._rank_len])
                    if best is None or rank < best[0]:
                        best = (rank, t)
        return None if best is None else best[1]

    def _unleased(self, tenant: str, fkey: bytes) -> bool:
        """No live lease holds the entry: the victim search's question, which (unlike
        :meth:`LeaseTable.claim`) neither counts an honoured lease nor claims the entry."""
        return not self._leases.leased(tenant, fkey)

    def _first_expired(self, txn: lmdb.Transaction, tenant: _Tenant, now: float) -> bytes | None:
        """The full key of the tenant's soonest-expiring entry if it has expired by ``now``."""
        with txn.cursor(db=tenant.expiry) as cur:
            if not cur.first():
                return None
            key = bytes(cur.key())
        return key[8:] if _BE64.unpack_from(key)[0] <= int(now * 1000) else None

    def _evict_one(self, txn: lmdb.Transaction, ledger: _Ledger, tenant: _Tenant) -> bool:
        """Drop the tenant's first expired entry, else its lowest-ranked one; False when it has neither."""
        victim_fkey = self._first_expired(txn, tenant, ledger.now)
        expired = victim_fkey is not None
        if victim_fkey is not None:
            self._leases.claim(tenant.name, victim_fkey, force=True)
        else:
            with txn.cursor(db=tenant.order) as order:
                if not self._first_evictable(order, ledger, tenant, self._leases.claim):
                    return False
                victim_fkey = bytes(order.key()[self._rank_len :])
                order.delete()
        victim = self._drop(txn, ledger, tenant, victim_fkey, ordered=expired)
        if victim is None:  # an order or expiry key without its entry: drop the stray key
            with txn.cursor(db=tenant.expiry) as cur:
                if expired and cur.first():
                    cur.delete()
            return True
        ledger.evicted[tenant.name] += 1
        if victim.source:
            ledger.ghosts.append((tenant.name, victim_fkey, victim.source))
        return True

    def _first_evictable(
        self, cur: lmdb.Cursor, ledger: _Ledger, tenant: _Tenant, free: Callable[[str, bytes], bool]
    ) -> bool:
        """Put ``cur`` on the tenant's lowest-ranked order key that ``free`` says no lease holds; walks
        past at most as many keys as the tenant holds leases (False when none is left within that).
        Within one transaction a walk resumes where the last one ended (an entry it passed whose lease
        ended since is left for the next transaction), so a flood of puts walks a run of leased entries
        once per transaction, not once per eviction."""
        start = ledger.past_leases.get(tenant.name)
        found = cur.first() if start is None else cur.set_range(start)
        for walked in range(self._leases.held(tenant.name) + 1):
            if not found:
                return False
            key = bytes(cur.key())
            if free(tenant.name, key[self._rank_len :]):
                if walked:
                    ledger.past_leases[tenant.name] = key
                return True
            found = cur.next()
        return False

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
        self._leases.clear(t.name for t in targets)
        with self._write_lock, self._rw.shared():
            ledger = self._ledger()
            deleted = 0
            with self._env.begin(write=True) as txn:
                for t in targets:
                    for db in (t.data, t.index, t.order, t.expiry, t.tokens):
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
        """Drop the entries ``select`` names (ending their leases), in one write transaction with the new
        totals."""
        with self._write_lock, self._rw.shared():
            ledger = self._ledger()
            deleted = 0
            with self._env.begin(write=True) as txn:
                chosen = select(txn)
                for fkey in chosen:
                    deleted += self._drop(txn, ledger, owner, fkey) is not None
                self._save_meta(txn, ledger)
            self._commit(ledger)
        self._leases.release(owner.name, chosen)
        return deleted

    def _drop(
        self, txn: lmdb.Transaction, ledger: _Ledger, owner: _Tenant, fkey: bytes, *, ordered: bool = True
    ) -> _Index | None:
        """Remove an entry (and its order key unless the caller already did, its expiry key and its
        parent's count of children), booked in ``ledger``."""
        raw = txn.get(fkey, db=owner.index)
        if raw is None:
            return None
        entry = _unpack_lenient(raw)  # a damaged record: charge what its fixed part says, if anything
        if ordered and not entry.protected:
            txn.delete(self._rank(entry) + fkey, db=owner.order)
        txn.delete(fkey, db=owner.index)
        txn.delete(fkey, db=owner.data)
        txn.delete(fkey, db=owner.tokens)
        ledger.remove(owner.name, entry)
        ledger.dropped.append((owner.name, fkey))
        ext = entry.ext
        if ext is not None and ext.expiry:
            txn.delete(_expiry_key(ext.expiry, fkey), db=owner.expiry)
        if ext is not None and ext.parent:
            self._adjust_sharing(txn, ledger, owner, _parent_key(fkey, ext.parent), -1)
        return entry

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

    def _after_reads(self, owner: _Tenant, tally: ReadTally) -> None:
        found = len(tally.found)
        expired = sum(tally.expired.values())
        with self._counter_lock:
            owner.hits += found
            owner.misses += tally.lookups - found
            owner.corrupt += len(tally.corrupt)
            owner.expired += expired
        misses = Counter(self._ghosts.classes(owner.name, tally.missing))
        misses.update(tally.expired)
        misses[""] += len(tally.corrupt)
        self.classes.note(owner.name, tally.hits, +misses, tally.expired)
        self._touch(owner, tally.found, hit=True)
        self._leases.release(owner.name, tally.found)
        if tally.corrupt:
            corrupt = tally.corrupt
            log.warning("dropping %d corrupt entries", len(corrupt))
            self._delete_entries(owner, lambda _txn: corrupt)

    def get_many(
        self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = DEFAULT_TENANT
    ) -> list[bytes | None]:
        """Copying convenience over :meth:`view_many`: None for missing or corrupt."""
        with self.view_many(namespace, keys, tenant=tenant) as views:
            return [bytes(v) if v is not None else None for _, v in views]

    def prefix_lookup(
        self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = DEFAULT_TENANT, lease_ms: int = 0
    ) -> int:
        """How many leading keys are present and unexpired (not verified: the BatchGet that follows
        verifies); with ``lease_ms`` they are leased (:mod:`tierkv.vault.leases`) and the count stops
        before any entry evicted while this lookup read."""
        owner = self._tenant(tenant)
        since = self._leases.mark() if lease_ms > 0 else 0
        present: list[tuple[bytes, int]] = []
        now = self.now()
        with self._rw.shared(), self._env.begin(buffers=True) as txn:
            for key in keys:
                fkey = full_key(namespace, key)
                raw = txn.get(fkey, db=owner.index)
                if raw is None:
                    break
                expiry = expiry_of(raw[_INDEX.size :]) if len(raw) > _INDEX.size else 0.0
                if 0.0 < expiry <= now:
                    break
                present.append((fkey, _U64.unpack_from(raw)[0]))
        if lease_ms > 0 and present:
            present = present[
                : self._leases.grant(owner.name, present, lease_ms, since=since, quota=owner.quota)
            ]
        self._touch(owner, [fkey for fkey, _ in present], hit=False)
        return len(present)

    def entry(self, namespace: bytes, key: bytes, *, tenant: str = DEFAULT_TENANT) -> EntryMeta | None:
        """One entry's retention figures (class, importance, expiry, decayed hits, stored children,
        protected); an entry without a retention record reads as the defaults; None if absent."""
        report = self.inspect(namespace, key, tenant=tenant)
        return None if report.status is Lookup.MISSING else report.meta or EntryMeta()

    def inspect(self, namespace: bytes, key: bytes, *, tenant: str = DEFAULT_TENANT) -> EntryReport:
        """One entry as stored, checksum verified, without counting a hit or moving its recency."""
        owner = self._tenant(tenant)
        fkey = full_key(namespace, key)
        with self._rw.shared(), self._env.begin(buffers=True) as txn:
            raw = txn.get(fkey, db=owner.index)
            if raw is None:
                return EntryReport(Lookup.MISSING)
            data = txn.get(fkey, db=owner.data)
            try:
                entry: _Index | None = _Index.unpack(raw)
            except ValueError:
                entry = None
            size, head = (0, b"") if data is None else (len(data), bytes(data[:HEAD_BYTES]))
            intact = data is not None and entry is not None and checksum(fkey, data) == entry.checksum
        if entry is None:
            return EntryReport(Lookup.CORRUPT, size=size, head=head)
        meta = entry.ext
        if meta is not None:
            with self._touch_lock:
                pending = self._touches.get((owner.name, fkey), 0)
            meta = dataclasses.replace(meta, hits=self._decayed(entry, self._clock) + pending)
        status = Lookup.FOUND if intact else Lookup.CORRUPT
        return EntryReport(status, size, entry.charge, entry.priority, head, meta)

    def namespaces(
        self, tenant: str | None = None, *, limit: int = 10_000
    ) -> tuple[list[NamespaceUsage], bool]:
        """Every namespace of ``tenant`` (of every tenant when None), in key order, with its figures;
        True with them when there were more than ``limit``. Reads the whole index, in short read
        transactions: an operator's question, not the serving path."""
        targets = list(self._tenants.values()) if tenant is None else [self._tenant(tenant)]
        found: list[NamespaceUsage] = []
        for t in targets:
            scan = _NamespaceScan(t, found, limit)
            start: bytes | None = b""
            while start is not None:
                with self._rw.shared(), self._env.begin(buffers=True) as txn:
                    start = scan.slice(txn, start)
            if scan.truncated:
                return found, True
        return found, False

    def chain_entries(
        self, namespace: bytes, *, tenant: str = DEFAULT_TENANT, limit: int = SCAN_SLICE
    ) -> list[ChainEntry]:
        """Entries of ``namespace`` that have a retention record (at most ``limit``, of the first ``limit``
        index records), with their decayed hits (reads not yet written included) and parent. Reads the
        index in short read transactions; for :mod:`tierkv.vault.hottest`, not the serving path."""
        owner = self._tenant(tenant)
        prefix = full_key(namespace, b"")
        with self._touch_lock:
            pending = {f: n for (name, f), n in self._touches.items() if name == owner.name and n}
        out: list[ChainEntry] = []
        start: bytes | None = prefix
        budget = limit
        while start is not None and budget > 0:
            with self._rw.shared(), self._env.begin(buffers=True) as txn, txn.cursor(db=owner.index) as cur:
                rows = _index_slice(cur, start, prefix, min(budget, SCAN_SLICE))
            budget -= len(rows)
            start = rows[-1][0] + b"\x00" if len(rows) == SCAN_SLICE else None
            for fkey, raw in rows:
                with contextlib.suppress(ValueError):
                    entry = _Index.unpack(raw)
                    if entry.ext is not None:
                        hits = self._decayed(entry, self._clock) + pending.get(fkey, 0)
                        ext = entry.ext
                        out.append(ChainEntry(fkey[len(prefix) :], ext.parent, hits, entry.clock, ext.source))
        return out

    def tokens_of(
        self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = DEFAULT_TENANT
    ) -> list[bytes | None]:
        """The token ids stored with each key (packed int32), None where there are none."""
        owner = self._tenant(tenant)
        with self._rw.shared(), self._env.begin() as txn:
            return [txn.get(full_key(namespace, k), db=owner.tokens) for k in keys]

    # -- recency -----------------------------------------------------------------------------------

    def _touch(self, owner: _Tenant, fkeys: Sequence[bytes], *, hit: bool) -> None:
        """Note reads for the next write transaction: recency always, a hit for a BatchGet that found it."""
        if not fkeys:
            return
        with self._touch_lock:
            touches = self._touches
            for fkey in fkeys:
                key = (owner.name, fkey)
                touches[key] = touches.pop(key, 0) + hit
            while len(touches) > _MAX_TOUCHES:
                touches.popitem(last=False)

    def _apply_touches(self, txn: lmdb.Transaction, ledger: _Ledger) -> None:
        with self._touch_lock:
            touched, self._touches = self._touches, OrderedDict()
        for (name, fkey), hits in touched.items():
            owner = self._tenants[name]
            entry = self._unranked(txn, owner, fkey)
            if entry is None:
                continue
            ledger.clock += 1
            if hits and (entry.ext is not None or self.policy.uses_meta):
                entry.ext = entry.ext or EntryMeta()
                entry.ext.hits = self._decayed(entry, ledger.clock) + hits
            entry.clock = ledger.clock
            self._write_index(txn, ledger, owner, fkey, entry)

    def _decayed(self, entry: _Index, clock: int) -> float:
        """The entry's hit count now: halved per ``hit_half_life`` turnovers under ``context``, else kept."""
        ext = entry.ext
        if ext is None:
            return 0.0
        if not isinstance(self.policy, ContextPolicy):
            return ext.hits
        return self.policy.decayed_hits(ext.hits, clock - entry.clock, ext.population)

    def apply_touches(self) -> None:
        """Write pending recency updates now (the maintenance thread does this every interval)."""
        with self._touch_lock:
            if not self._touches:
                return
        with self._write_lock, self._rw.shared():
            ledger = self._ledger()
            with self._env.begin(write=True) as txn:
                self._apply_touches(txn, ledger)
                self._save_meta(txn, ledger)
            self._commit(ledger)

    def purge_expired(self, limit: int = PURGE_BATCH) -> int:
        """Drop up to ``limit`` expired entries per tenant (the maintenance thread calls this each
        interval); returns how many went. A read transaction first, so a store without any opens no
        write transaction."""
        now = self.now()
        with self._rw.shared(), self._env.begin(buffers=True) as txn:
            due = [t for t in self._tenants.values() if self._first_expired(txn, t, now) is not None]
        if not due:
            return 0
        with self._write_lock, self._rw.shared(), self._leases.writing():
            ledger = self._ledger()
            with self._env.begin(write=True) as txn:
                for t in due:
                    for _ in range(limit):
                        if self._first_expired(txn, t, ledger.now) is None:
                            break
                        self._evict_one(txn, ledger, t)
                self._save_meta(txn, ledger)
            self._commit(ledger)
        return sum(ledger.evicted.values())

    def _maintain(self, interval: float) -> None:
        while not self._closed.wait(interval):
            try:
                self.apply_touches()
                self.purge_expired()
                self._leases.sweep()
                if self.sync_mode == "fast":
                    self._env.sync(True)
            except Exception:
                log.exception("store maintenance failed")

    # -- lifecycle ---------------------------------------------------------------------------------

    def stats(self, tenant: str | None = None) -> StoreStats:
        """The whole store's figures (the sum of its tenants'), or one tenant's (its quota, when it has
        one, as ``max_bytes``)."""
        map_size = self._env.info()["map_size"]
        with self._counter_lock:
            if tenant is None:
                picked, limit = list(self._tenants.values()), self.max_bytes
            else:
                who = self._tenant(tenant)
                picked, limit = [who], min(self.max_bytes, who.quota or self.max_bytes)
            return StoreStats(
                keys=sum(t.count for t in picked),
                used_bytes=sum(t.used for t in picked),
                max_bytes=limit,
                hits=sum(t.hits for t in picked),
                misses=sum(t.misses for t in picked),
                evictions=sum(t.evictions for t in picked),
                corrupt=sum(t.corrupt for t in picked),
                map_size=map_size,
                expired=sum(t.expired for t in picked),
                protected_bytes=sum(t.protected for t in picked),
                protected_overflow=sum(t.overflow for t in picked),
                leases=self._leases.counts(t.name for t in picked),
            )

    def tenant_usage(self) -> list[TenantUsage]:
        with self._counter_lock:
            return [
                TenantUsage(t.name, t.count, t.used, t.quota, t.evictions, t.protected, t.overflow, t.expired)
                for t in self._tenants.values()
            ]

    def class_usage(self, tenant: str | None = None) -> list[ClassUsage]:
        """Per tenant (all, or one) and source class: stored keys and bytes, lookups, 5-minute window.
        Class ``""`` holds untagged entries and misses of unknown class."""
        stored: dict[tuple[str, str], tuple[int, int, int]] = {}
        with self._counter_lock:
            for t in self._tenants.values():
                if tenant is not None and t.name != tenant:
                    continue
                for source in set(t.classes) | set(t.class_keys):
                    label = self.classes.label(t.name, source)
                    k, b, p = stored.get((t.name, label), (0, 0, 0))
                    stored[(t.name, label)] = (
                        k + t.class_keys[source],
                        b + t.classes[source],
                        p + t.class_protected[source],
                    )
                untagged = (
                    t.count - sum(t.class_keys.values()),
                    t.used - sum(t.classes.values()),
                    t.class_protected[""],
                )
                if untagged[0] or untagged[1]:
                    stored[(t.name, "")] = untagged
        return self.classes.usage(tenant, stored)

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


def _unpack_lenient(raw: bytes | memoryview) -> _Index:
    """An index record; a damaged one as what its fixed part says (charge and checksum), if anything."""
    try:
        return _Index.unpack(raw)
    except ValueError:
        return _Index(*_INDEX.unpack_from(raw)) if len(raw) >= _INDEX.size else _Index(0, 0, 0, 0)


def _index_slice(cur: lmdb.Cursor, start: bytes, prefix: bytes, limit: int) -> list[tuple[bytes, bytes]]:
    """Up to ``limit`` (full key, index record) pairs from ``start`` on that begin with ``prefix``."""
    rows: list[tuple[bytes, bytes]] = []
    if not cur.set_range(start):
        return rows
    for fkey, raw in cur.iternext():
        if len(rows) >= limit or bytes(fkey[: len(prefix)]) != prefix:
            break
        rows.append((bytes(fkey), bytes(raw)))
    return rows


def _get_u64(txn: lmdb.Transaction, db: Any, key: bytes) -> int:
    raw = txn.get(key, db=db)
    return 0 if raw is None else int(_U64.unpack(raw)[0])


def _chunks(items: Sequence[Any], limit: int) -> Iterator[tuple[int, Sequence[Any]]]:
    """``(start, run)`` of consecutive items whose blobs total at most ``limit`` bytes (at least one)."""
    start, size = 0, 0
    for i, item in enumerate(items):
        data = item[1]
        if i > start and size + len(data) > limit:
            yield start, items[start:i]
            start, size = i, 0
        size += len(data)
    if start < len(items):
        yield start, items[start:]


def _expiry_key(expiry: float, fkey: bytes) -> bytes:
    return _BE64.pack(int(expiry * 1000)) + fkey


def _parent_key(fkey: bytes, parent: bytes) -> bytes:
    """The full key of ``parent`` in the namespace of ``fkey``."""
    return fkey[: 1 + fkey[0]] + parent


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step
