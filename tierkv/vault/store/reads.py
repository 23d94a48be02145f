"""Reads: checksum-verified, zero-copy, in short read transactions; lookups; one entry inspected.

Every read verifies the checksum (seeded with the full key, so a blob can't be served under another key);
a mismatch is reported as CORRUPT, and the store counts and drops the entry when the reader closes. A key
LMDB cannot read (a damaged page) is CORRUPT too, but stays: deleting it would read the same page. An
entry past its time to live reads as a miss (counted as expired). Hits, misses and recency are what the
reader's :class:`ReadTally` tells the store when it closes; reads themselves write nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections import Counter
from collections.abc import Callable, Sequence

import lmdb

from tierkv.vault.entrymeta import EntryMeta, expiry_of
from tierkv.vault.store.env import StoreEnv
from tierkv.vault.store.format import INDEX_SIZE, IndexRecord, charge_of, checksum, full_key
from tierkv.vault.store.tenants import Tenant

READ_TXN_MAX_S = 0.5
"""A reader in the middle of a reply ends its read transaction after this long (and reopens one)."""
HEAD_BYTES = 320
"""How much of a blob inspection returns: enough for a tierkv blob header (at most 312 bytes)."""


class Lookup(enum.IntEnum):
    FOUND = 1
    MISSING = 2
    CORRUPT = 3


@dataclasses.dataclass
class ReadTally:
    """What one reader saw: found, missing, corrupt keys and, per source class, hits and expired reads."""

    lookups: int = 0
    found: list[bytes] = dataclasses.field(default_factory=list)
    missing: list[bytes] = dataclasses.field(default_factory=list)
    corrupt: list[bytes] = dataclasses.field(default_factory=list)
    damaged: list[bytes] = dataclasses.field(default_factory=list)
    """Keys LMDB itself could not read (a damaged page in data.mdb): misses that no write can drop."""
    hits: Counter[str] = dataclasses.field(default_factory=Counter)
    expired: Counter[str] = dataclasses.field(default_factory=Counter)


class Reader:
    """Checksum-verified, zero-copy reads of one tenant's entries in short read transactions.

    A view returned by :meth:`get` is valid until :meth:`release` or :meth:`close`. The transaction opens
    on the first ``get`` after a release, so a caller that sends views to a slow peer releases (after
    copying what it still needs) instead of pinning LMDB pages and blocking map growth for as long as the
    peer takes; :attr:`stale` says when a caller should release even though nothing is blocked.
    """

    def __init__(
        self, env: StoreEnv, tenant: Tenant, now: float, on_close: Callable[[Tenant, ReadTally], None]
    ) -> None:
        self._env = env
        self._tenant = tenant
        self._on_close = on_close
        self._txn: lmdb.Transaction | None = None
        self._spent: list[lmdb.Transaction] = []
        """Transactions a damaged page ended (LMDB refuses every later read in them), kept open until the
        release so that the views they handed out stay pinned."""
        self._opened = 0.0
        self._now = now
        self.tally = ReadTally()

    @property
    def stale(self) -> bool:
        """The open transaction is old or a map resize waits for it."""
        return self.pinned and (
            time.monotonic() - self._opened > READ_TXN_MAX_S or self._env.rw.exclusive_waiting
        )

    @property
    def pinned(self) -> bool:
        """A read transaction is open: views handed out since the last release point into the map."""
        return self._txn is not None or bool(self._spent)

    def get(self, namespace: bytes, key: bytes) -> tuple[Lookup, memoryview | None]:
        return self.read(full_key(namespace, key))

    def read(self, fkey: bytes) -> tuple[Lookup, memoryview | None]:
        """:meth:`get` by full key (a caller reading many keys of one namespace builds them itself)."""
        txn = self._begin()
        tally = self.tally
        tally.lookups += 1
        try:
            raw = txn.get(fkey, db=self._tenant.index)
            data = None if raw is None else txn.get(fkey, db=self._tenant.data)
        except (lmdb.CorruptedError, lmdb.PageNotFoundError):
            self._spent.append(txn)
            self._txn = None
            tally.damaged.append(fkey)
            return Lookup.CORRUPT, None
        if raw is None:
            tally.missing.append(fkey)
            return Lookup.MISSING, None
        try:
            entry = IndexRecord.unpack(raw)
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
            # one hold of the shared lock covers the spent transactions and this one: acquiring a second
            # while a map resize waits would wait for the resize, which waits for the first
            held = bool(self._spent)
            if not held:
                self._env.rw.acquire_shared()
            try:
                self._txn = self._env.env.begin(buffers=True)
            except BaseException:
                if not held:
                    self._env.rw.release_shared()
                raise
            if not held:
                self._opened = time.monotonic()
        return self._txn

    def release(self) -> None:
        """End the read transaction: every view handed out so far is invalid from here on."""
        spent, self._spent = self._spent, []
        if self._txn is not None:
            spent.append(self._txn)
            self._txn = None
        for txn in spent:
            txn.abort()
        if spent:
            self._env.rw.release_shared()

    def close(self) -> None:
        """Release, then hand the tally to the store (hits, misses, recency, corrupt entries dropped)."""
        self.release()
        tally, self.tally = self.tally, ReadTally()
        self._on_close(self._tenant, tally)


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


def present_run(
    env: StoreEnv, owner: Tenant, namespace: bytes, keys: Sequence[bytes], now: float
) -> list[tuple[bytes, int]]:
    """(full key, charge) of the leading keys present and unexpired (not verified)."""
    present: list[tuple[bytes, int]] = []
    with env.read() as txn:
        for key in keys:
            fkey = full_key(namespace, key)
            raw = txn.get(fkey, db=owner.index)
            if raw is None:
                break
            expiry = expiry_of(raw[INDEX_SIZE:]) if len(raw) > INDEX_SIZE else 0.0
            if 0.0 < expiry <= now:
                break
            present.append((fkey, charge_of(raw)))
    return present


def inspect_entry(
    env: StoreEnv, owner: Tenant, fkey: bytes, hits_now: Callable[[IndexRecord], float]
) -> EntryReport:
    """One entry as stored, checksum verified, without counting a hit or moving its recency;
    ``hits_now`` gives the entry's decayed hits with reads not yet written."""
    with env.read() as txn:
        raw = txn.get(fkey, db=owner.index)
        if raw is None:
            return EntryReport(Lookup.MISSING)
        data = txn.get(fkey, db=owner.data)
        try:
            entry: IndexRecord | None = IndexRecord.unpack(raw)
        except ValueError:
            entry = None
        size, head = (0, b"") if data is None else (len(data), bytes(data[:HEAD_BYTES]))
        intact = data is not None and entry is not None and checksum(fkey, data) == entry.checksum
    if entry is None:
        return EntryReport(Lookup.CORRUPT, size=size, head=head)
    meta = entry.ext
    if meta is not None:
        meta = dataclasses.replace(meta, hits=hits_now(entry))
    status = Lookup.FOUND if intact else Lookup.CORRUPT
    return EntryReport(status, size, entry.charge, entry.priority, head, meta)


__all__ = [
    "HEAD_BYTES",
    "READ_TXN_MAX_S",
    "EntryReport",
    "Lookup",
    "ReadTally",
    "Reader",
    "inspect_entry",
    "present_run",
]
