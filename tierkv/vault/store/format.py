"""The one file that defines ``data.mdb``: its databases, its records and its format version.

One LMDB environment holds a ``meta`` database and, per tenant, five databases (the ``default`` tenant's
are unprefixed, so stores from before tenancy open unchanged; tenant ``t``'s are ``t/data`` …):

``data``   full key → the blob, exactly as the client sent it (no framing, no copy on the way in)
``index``  full key → :class:`IndexRecord`: charge (u64), clock (u64), priority (u16), xxh3-64 checksum
           (u64), and for an entry stored with retention metadata a tail
           (:class:`~tierkv.vault.entrymeta.EntryMeta`)
``order``  policy rank + full key → empty; the eviction order, lowest first (protected entries are not
           in it: eviction never sees them)
``expiry`` expiry time (ms, big-endian u64) + full key → empty; entries with a time to live, soonest first
``tokens`` full key → the block's token ids (little-endian int32), for entries stored with them; apart
           from the index so that the records eviction and scans read stay small
``meta``   ``format`` (this module's :data:`FORMAT_VERSION`), ``used``/``count`` (totals; ``used/t`` and
           ``count/t`` per tenant, the default tenant has the rest), ``clock`` (the logical clock) and
           ``policy`` (the policy the order was ranked by)

A full key is ``len(namespace) ‖ namespace ‖ key``. An entry is charged ``len(namespace) + len(key) +
len(blob)`` (+ its token ids' bytes) against the budget.

The format version is checked at open: a store written by a newer format is refused with a message
instead of being misread; a store without one is version 1 (every store before versions were written)
and gets it written.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path
from typing import Any

import lmdb
import xxhash

from tierkv.limits import check_namespace
from tierkv.vault.entrymeta import EntryMeta
from tierkv.vault.files import DATA_FILE, DataFileDamaged, VaultDirectoryError

FORMAT_VERSION = 1
TENANT_DATABASES = (b"data", b"index", b"order", b"expiry", b"tokens")
META = b"meta"
FORMAT_KEY = b"format"
USED_KEY = b"used"
COUNT_KEY = b"count"
CLOCK_KEY = b"clock"
POLICY_KEY = b"policy"

_INDEX = struct.Struct("<QQHQ")
INDEX_SIZE = _INDEX.size
_U64 = struct.Struct("<Q")
_BE64 = struct.Struct(">Q")


class StoreFormatError(VaultDirectoryError):
    """The data file was written in a format this tierkv does not read."""


@dataclasses.dataclass(slots=True)
class IndexRecord:
    """One entry's index record: its charge, recency, priority, checksum and retention tail."""

    charge: int
    clock: int
    priority: int
    checksum: int
    ext: EntryMeta | None = None

    @classmethod
    def unpack(cls, raw: bytes | memoryview) -> IndexRecord:
        """ValueError (struct.error is one) when ``raw`` is no index record."""
        if len(raw) == _INDEX.size:
            return cls(*_INDEX.unpack(raw))
        if len(raw) < _INDEX.size:
            raise ValueError("index record too short")
        charge, clock, priority, check = _INDEX.unpack_from(raw)
        return cls(charge, clock, priority, check, EntryMeta.unpack(raw, _INDEX.size))

    @classmethod
    def lenient(cls, raw: bytes | memoryview) -> IndexRecord:
        """A record; a damaged one as what its fixed part says (charge and checksum), if anything."""
        try:
            return cls.unpack(raw)
        except ValueError:
            return cls(*_INDEX.unpack_from(raw)) if len(raw) >= _INDEX.size else cls(0, 0, 0, 0)

    def pack(self) -> bytes:
        base = _INDEX.pack(self.charge, self.clock, self.priority, self.checksum)
        return base if self.ext is None else base + self.ext.pack()

    @property
    def protected(self) -> bool:
        return self.ext is not None and self.ext.protected

    @property
    def source(self) -> str:
        return "" if self.ext is None else self.ext.source


def entry_charge(fkey: bytes, data: bytes | bytearray | memoryview, tokens: bytes = b"") -> int:
    """The bytes an entry counts against its budgets: namespace and key (the full key less its length
    byte), value and packed tokens."""
    return len(fkey) - 1 + len(data) + len(tokens)


def charge_of(raw: bytes | memoryview) -> int:
    """The charge of a raw index record without unpacking the rest."""
    return int(_U64.unpack_from(raw)[0])


def full_key(namespace: bytes, key: bytes) -> bytes:
    return key_prefix(namespace) + key


def key_prefix(namespace: bytes) -> bytes:
    """What every full key of ``namespace`` starts with (a full key is this prefix and the key)."""
    return bytes((len(check_namespace(namespace)),)) + namespace


def split_full_key(fkey: bytes) -> tuple[bytes, bytes]:
    """(namespace, key) of a full key: the inverse of :func:`full_key`."""
    n = fkey[0]
    return fkey[1 : 1 + n], fkey[1 + n :]


def parent_key(fkey: bytes, parent: bytes) -> bytes:
    """The full key of ``parent`` in the namespace of ``fkey``."""
    return fkey[: 1 + fkey[0]] + parent


def checksum(fkey: bytes, data: bytes | bytearray | memoryview) -> int:
    """xxh3-64 of the blob seeded with its full key, so a blob cannot be served under another key."""
    return xxhash.xxh3_64_intdigest(data, seed=xxhash.xxh3_64_intdigest(fkey))


def expiry_key(expiry: float, fkey: bytes) -> bytes:
    return _BE64.pack(int(expiry * 1000)) + fkey


def expiry_ms(key: bytes) -> int:
    """The expiry time (ms) an ``expiry`` database key starts with."""
    return int(_BE64.unpack_from(key)[0])


def tenant_databases(name: str, default: bool) -> tuple[bytes, ...]:
    """The names of a tenant's five databases."""
    prefix = b"" if default else name.encode() + b"/"
    return tuple(prefix + part for part in TENANT_DATABASES)


def tenants_in(txn: lmdb.Transaction) -> set[str]:
    """Tenants whose databases the file holds (besides the default one)."""
    return {
        bytes(k)[: -len(b"/data")].decode(errors="replace")
        for k in txn.cursor().iternext(values=False)
        if bytes(k).endswith(b"/data")
    }


def get_u64(txn: lmdb.Transaction, db: Any, key: bytes, source: str) -> int:
    """A ``meta`` record (0 when absent); one that is not 8 bytes is :class:`DataFileDamaged`, named with
    ``source`` (the store's directory)."""
    raw = txn.get(key, db=db)
    if raw is None:
        return 0
    if len(raw) != _U64.size:
        raise DataFileDamaged(
            f"{Path(source) / DATA_FILE}: its {key.decode(errors='replace')!r} record is damaged "
            f"({len(raw)} bytes where 8 belong); refusing to start (restore a backup, or move the "
            "directory aside to start empty)"
        )
    return int(_U64.unpack(raw)[0])


def put_u64(txn: lmdb.Transaction, db: Any, key: bytes, value: int) -> None:
    txn.put(key, _U64.pack(value), db=db)


def check_format(txn: lmdb.Transaction, meta: Any, source: str) -> None:
    """Refuse a newer format; write the version into a store that has none (or an older one)."""
    stored = get_u64(txn, meta, FORMAT_KEY, source) or 1
    if stored > FORMAT_VERSION:
        raise StoreFormatError(
            f"{source}: data format {stored} is newer than this tierkv reads ({FORMAT_VERSION}); "
            "upgrade tierkv or point the vault at another directory"
        )
    put_u64(txn, meta, FORMAT_KEY, FORMAT_VERSION)


__all__ = [
    "FORMAT_VERSION",
    "INDEX_SIZE",
    "IndexRecord",
    "StoreFormatError",
    "charge_of",
    "check_format",
    "checksum",
    "entry_charge",
    "expiry_key",
    "expiry_ms",
    "full_key",
    "get_u64",
    "parent_key",
    "put_u64",
    "split_full_key",
    "tenant_databases",
    "tenants_in",
]
