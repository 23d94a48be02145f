"""The vault's storage engine: LMDB, bounded in bytes, checksummed, crash-consistent — a package by concern.

- :mod:`.format`: the one definition of ``data.mdb`` (databases, records, full keys, the format version);
- :mod:`.env`: the LMDB environment, its locks, map growth and a full disk;
- :mod:`.tenants`: tenants, their databases and quotas;
- :mod:`.ledger`: the accounting inside a write transaction, saved with it;
- :mod:`.evictor`: the one place the eviction policy is consulted, and the victim search;
- :mod:`.entries`: writing and removing one entry with everything that hangs off it;
- :mod:`.recency`: reads noted in memory and written by the next write transaction;
- :mod:`.reads`: verified zero-copy reads, lookups, inspection;
- :mod:`.scans`: operator scans over the index;
- :mod:`.opening`: what an open reads once (totals, clock, the ranking policy, retention figures);
- :mod:`.maintenance`: the thread that runs the chores no request should wait for;
- :mod:`.stats`: the store's figures;
- :mod:`.debug`: raw views of the databases for tests;
- :mod:`.store`: :class:`Store`, the façade that wires them together.
"""

from tierkv.vault.store.env import MAX_TENANTS, DiskFullError, StoreFullError
from tierkv.vault.store.format import (
    FORMAT_VERSION,
    StoreFormatError,
    checksum,
    full_key,
    key_prefix,
    split_full_key,
)
from tierkv.vault.store.reads import HEAD_BYTES, READ_TXN_MAX_S, EntryReport, Lookup, Reader, ReadTally
from tierkv.vault.store.scans import SCAN_SLICE, ChainEntry, NamespaceUsage
from tierkv.vault.store.stats import PutOutcome, StoreStats
from tierkv.vault.store.store import PURGE_BATCH, Item, Store
from tierkv.vault.store.tenants import DEFAULT_TENANT, UnknownTenantError, check_tenant

__all__ = [
    "DEFAULT_TENANT",
    "FORMAT_VERSION",
    "HEAD_BYTES",
    "MAX_TENANTS",
    "PURGE_BATCH",
    "READ_TXN_MAX_S",
    "SCAN_SLICE",
    "ChainEntry",
    "DiskFullError",
    "EntryReport",
    "Item",
    "Lookup",
    "NamespaceUsage",
    "PutOutcome",
    "ReadTally",
    "Reader",
    "Store",
    "StoreFormatError",
    "StoreFullError",
    "StoreStats",
    "UnknownTenantError",
    "check_tenant",
    "checksum",
    "full_key",
    "key_prefix",
    "split_full_key",
]
