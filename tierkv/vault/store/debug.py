"""A read-mostly view of the raw databases, for tests and diagnostics: what is really on disk.

Tests compare the store against a model through this view instead of reaching into private attributes,
and damage entries on purpose through :meth:`StoreDebug.overwrite_blob` (which bypasses the checksum,
as a flipped bit on disk would).
"""

from __future__ import annotations

import contextlib

from tierkv.vault.leases import LeaseTable
from tierkv.vault.store.env import StoreEnv
from tierkv.vault.store.format import full_key
from tierkv.vault.store.tenants import DEFAULT_TENANT, Tenants


class StoreDebug:
    """Raw contents of one store's databases, by tenant."""

    def __init__(self, env: StoreEnv, tenants: Tenants, leases: LeaseTable) -> None:
        self._env = env
        self._tenants = tenants
        self._leases = leases

    def blobs(self, tenant: str = DEFAULT_TENANT) -> dict[bytes, bytes]:
        """Full key → blob, every entry of the tenant's ``data`` database."""
        db = self._tenants[tenant].data
        with self._env.read(buffers=False) as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor(db=db)}

    def index_keys(self, tenant: str = DEFAULT_TENANT) -> set[bytes]:
        """Full keys of the tenant's ``index`` database."""
        db = self._tenants[tenant].index
        with self._env.read(buffers=False) as txn:
            return {bytes(k) for k in txn.cursor(db=db).iternext(values=False)}

    def index_record(self, namespace: bytes, key: bytes, tenant: str = DEFAULT_TENANT) -> bytes | None:
        """The raw index record of one entry, None when it has none."""
        db = self._tenants[tenant].index
        with self._env.read(buffers=False) as txn:
            raw = txn.get(full_key(namespace, key), db=db)
        return None if raw is None else bytes(raw)

    def order_keys(self, tenant: str = DEFAULT_TENANT) -> list[bytes]:
        """The tenant's eviction order (rank + full key), lowest first."""
        db = self._tenants[tenant].order
        with self._env.read(buffers=False) as txn:
            return [bytes(k) for k in txn.cursor(db=db).iternext(values=False)]

    def overwrite_blob(self, namespace: bytes, key: bytes, data: bytes, tenant: str = DEFAULT_TENANT) -> None:
        """Replace one blob's bytes and nothing else (its checksum stays): damage, on purpose."""
        db = self._tenants[tenant].data
        with self._env.write() as txn:
            txn.put(full_key(namespace, key), data, db=db)

    def resize_lock(self) -> contextlib.AbstractContextManager[None]:
        """The lock a map resize takes (alone, after every open transaction)."""
        return self._env.rw.exclusive()

    def resize_waiting(self) -> bool:
        """A map resize waits for the lock (and holds back new transactions meanwhile)."""
        return self._env.rw.exclusive_waiting

    def lease_deadlines(self) -> list[float]:
        """Deadlines of the leases the table holds now (ended ones not yet swept included)."""
        return [deadline for deadline, _ in self._leases._leases.values()]


__all__ = ["StoreDebug"]
