"""The store's accounting: figures inside one write transaction, saved with it, taken once it committed.

A :class:`Ledger` starts from the tenants' committed figures, is changed by every write, drop and
eviction of one transaction, is saved into ``meta`` in that same transaction (so the accounting is
exactly as durable as the data) and is taken into the tenants only after the commit.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

import lmdb

from tierkv.vault.store.format import CLOCK_KEY, COUNT_KEY, USED_KEY, IndexRecord, get_u64, put_u64
from tierkv.vault.store.tenants import DEFAULT_TENANT, Tenant

log = logging.getLogger("tierkv.vault.store")


class Ledger:
    """Usage figures inside one write transaction; ``now`` is the injected clock's reading for it."""

    def __init__(self, tenants: Iterable[Tenant], clock: int, now: float) -> None:
        tenants = list(tenants)
        self.clock = clock
        self.now = now
        self.used = {t.name: t.used for t in tenants}
        self.count = {t.name: t.count for t in tenants}
        self.protected = {t.name: t.protected for t in tenants}
        self.proven = {t.name: t.proven for t in tenants}
        self.classes = {t.name: Counter(t.classes) for t in tenants}
        self.class_keys = {t.name: Counter(t.class_keys) for t in tenants}
        self.class_protected = {t.name: Counter(t.class_protected) for t in tenants}
        self.total = sum(self.used.values())
        self.population = sum(self.count.values())
        self.evicted: Counter[str] = Counter()
        self.admitting: set[str] = set()
        """Tenants whose learner admitted entries in this transaction (beside those it evicted from)."""
        self.overflow: Counter[str] = Counter()
        self.ghosts: list[tuple[str, bytes, str]] = []
        self.dropped: list[tuple[str, bytes]] = []
        self.orphans: Counter[tuple[str, bytes]] = Counter()
        """(tenant, parent full key): children this transaction wrote while the parent was not stored. A
        leaf-first policy writes a Put's chain deepest first, so a parent written later in the same
        transaction starts with these children counted."""
        self.past_leases: dict[tuple[str, bytes], bytes] = {}
        """Per tenant and start of the walk, the order key eviction reached after walking past leased
        entries in this transaction: the next eviction starts there instead of walking past them again."""

    @property
    def protected_total(self) -> int:
        return sum(self.protected.values())

    def add(self, tenant: str, entry: IndexRecord) -> None:
        self._apply(tenant, entry, 1)

    def remove(self, tenant: str, entry: IndexRecord) -> None:
        if entry.charge > self.used[tenant]:
            # a record damaged on disk (its checksum covers the blob, not the record): taking its charge
            # off whole would make the totals negative, and no write could save them again
            log.warning("an index record charges %d bytes, more than its tenant holds", entry.charge)
            entry = dataclasses.replace(entry, charge=self.used[tenant])
        self._apply(tenant, entry, -1)

    def _apply(self, tenant: str, entry: IndexRecord, sign: int) -> None:
        charge = sign * entry.charge
        self.used[tenant] += charge
        self.count[tenant] += sign
        self.population += sign
        self.total += charge
        self.count_retention(tenant, entry, sign)

    def count_retention(self, tenant: str, entry: IndexRecord, sign: int = 1) -> None:
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
        elif entry.ext.proven:
            self.proven[tenant] += charge

    def clear(self, tenant: str) -> int:
        self.total -= self.used[tenant]
        self.population -= self.count[tenant]
        dropped, self.used[tenant], self.count[tenant] = self.count[tenant], 0, 0
        self.protected[tenant] = 0
        self.proven[tenant] = 0
        for book in (self.classes, self.class_keys, self.class_protected):
            book[tenant] = Counter()
        return dropped

    def save(self, txn: lmdb.Transaction, meta: Any, tenants: Iterable[Tenant]) -> None:
        """The totals into ``meta``, in the transaction they belong to."""
        put_u64(txn, meta, USED_KEY, self.total)
        put_u64(txn, meta, COUNT_KEY, sum(self.count.values()))
        put_u64(txn, meta, CLOCK_KEY, self.clock)
        for t in tenants:
            if t.name != DEFAULT_TENANT:
                put_u64(txn, meta, USED_KEY + t.meta_suffix, self.used[t.name])
                put_u64(txn, meta, COUNT_KEY + t.meta_suffix, self.count[t.name])

    def take_into(self, tenants: Iterable[Tenant], lock: threading.Lock) -> None:
        """The committed figures into the tenants (under the lock their readers take)."""
        with lock:
            for t in tenants:
                t.used, t.count = self.used[t.name], self.count[t.name]
                t.evictions += self.evicted[t.name]
                t.overflow += self.overflow[t.name]
                t.protected = self.protected[t.name]
                t.proven = self.proven[t.name]
                t.classes = +self.classes[t.name]
                t.class_keys = +self.class_keys[t.name]
                t.class_protected = +self.class_protected[t.name]


def load_totals(txn: lmdb.Transaction, meta: Any, tenants: Iterable[Tenant], source: str) -> int:
    """Read the totals into the tenants (the default tenant has what the others do not); the clock.
    ``source`` names the store in the error a damaged record is."""
    tenants = list(tenants)
    used = get_u64(txn, meta, USED_KEY, source)
    count = get_u64(txn, meta, COUNT_KEY, source)
    default = None
    for t in tenants:
        if t.name == DEFAULT_TENANT:
            default = t
            continue
        t.used = get_u64(txn, meta, USED_KEY + t.meta_suffix, source)
        t.count = get_u64(txn, meta, COUNT_KEY + t.meta_suffix, source)
        used, count = used - t.used, count - t.count
    if default is not None:
        default.used, default.count = max(0, used), max(0, count)
    return get_u64(txn, meta, CLOCK_KEY, source)


__all__ = ["Ledger", "load_totals"]
