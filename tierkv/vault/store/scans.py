"""Operator scans over the index: namespaces with their figures, and the chains a warm start walks.

An operator's question, not the serving path: the index is read in short read transactions of at most
:data:`SCAN_SLICE` entries, so a large store never holds one read transaction for long (and never blocks
map growth for the length of a scan).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence

import lmdb

from tierkv.vault.store.env import StoreEnv
from tierkv.vault.store.format import IndexRecord, full_key, split_full_key
from tierkv.vault.store.reads import HEAD_BYTES
from tierkv.vault.store.tenants import Tenant

SCAN_SLICE = 10_000
"""Entries read per read transaction by a scan."""


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


@dataclasses.dataclass(frozen=True, slots=True)
class ChainEntry:
    """One entry as a warm start sees it: its key, its parent's, its decayed hits, recency and class."""

    key: bytes
    parent: bytes
    hits: float
    clock: int
    source: str


class _NamespaceScan:
    """Adds up one tenant's index, namespace by namespace, a slice of entries per read transaction."""

    def __init__(self, tenant: Tenant, found: list[NamespaceUsage], limit: int) -> None:
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
        entry = IndexRecord.lenient(raw)
        last.keys += 1
        last.used_bytes += entry.charge
        last.protected_bytes += entry.charge if entry.protected else 0
        return True


def namespaces(env: StoreEnv, targets: Sequence[Tenant], limit: int) -> tuple[list[NamespaceUsage], bool]:
    """Every namespace of ``targets``, in key order, with its figures; True with them when there were
    more than ``limit``."""
    found: list[NamespaceUsage] = []
    for t in targets:
        scan = _NamespaceScan(t, found, limit)
        start: bytes | None = b""
        while start is not None:
            with env.read() as txn:
                start = scan.slice(txn, start)
        if scan.truncated:
            return found, True
    return found, False


def chain_entries(
    env: StoreEnv,
    owner: Tenant,
    namespace: bytes,
    limit: int,
    hits_now: Callable[[IndexRecord, bytes], float],
) -> list[ChainEntry]:
    """Entries of ``namespace`` that have a retention record (at most ``limit``, of the first ``limit``
    index records), with ``hits_now(entry, full key)`` as their hits."""
    prefix = full_key(namespace, b"")
    out: list[ChainEntry] = []
    start: bytes | None = prefix
    budget = limit
    while start is not None and budget > 0:
        with env.read() as txn, txn.cursor(db=owner.index) as cur:
            rows = _index_slice(cur, start, prefix, min(budget, SCAN_SLICE))
        budget -= len(rows)
        start = rows[-1][0] + b"\x00" if len(rows) == SCAN_SLICE else None
        for fkey, raw in rows:
            with contextlib.suppress(ValueError):
                entry = IndexRecord.unpack(raw)
                if entry.ext is not None:
                    ext = entry.ext
                    hits = hits_now(entry, fkey)
                    out.append(ChainEntry(fkey[len(prefix) :], ext.parent, hits, entry.clock, ext.source))
    return out


def keys_with_prefix(txn: lmdb.Transaction, owner: Tenant, prefix: bytes) -> list[bytes]:
    """Every full key of the tenant's index that starts with ``prefix``."""
    found: list[bytes] = []
    with txn.cursor(db=owner.index) as cur:
        if cur.set_range(prefix):
            for fkey in cur.iternext(keys=True, values=False):
                if not bytes(fkey).startswith(prefix):
                    break
                found.append(bytes(fkey))
    return found


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


__all__ = ["SCAN_SLICE", "ChainEntry", "NamespaceUsage", "chain_entries", "keys_with_prefix", "namespaces"]
