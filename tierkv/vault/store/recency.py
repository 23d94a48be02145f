"""Recency without a write per read: reads are noted in memory and written by the next write transaction.

Reads never open a write transaction. A lookup or a read notes its keys (a read also counts a hit); the
next Put, or the maintenance thread every interval, moves each noted entry to the front of the order with
its decayed hits plus the new ones. So recency is approximate by at most one maintenance interval, and a
burst of reads costs one write. At most :data:`MAX_TOUCHES` keys wait; beyond that the oldest notes go.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import lmdb

from tierkv.vault.entrymeta import EntryMeta
from tierkv.vault.store.entries import Entries
from tierkv.vault.store.ledger import Ledger
from tierkv.vault.store.tenants import Tenant

MAX_TOUCHES = 200_000


class Touches:
    """Reads not yet written: (tenant, full key) → hits, oldest first. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._touches: OrderedDict[tuple[str, bytes], int] = OrderedDict()

    def note(self, tenant: str, fkeys: Sequence[bytes], *, hit: bool) -> None:
        """Note reads for the next write transaction: recency always, a hit for a read that found it."""
        if not fkeys:
            return
        with self._lock:
            touches = self._touches
            for fkey in fkeys:
                key = (tenant, fkey)
                touches[key] = touches.pop(key, 0) + hit
            while len(touches) > MAX_TOUCHES:
                touches.popitem(last=False)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._touches)

    def pending(self, tenant: str, fkey: bytes) -> int:
        """Hits noted for one entry and not written yet."""
        with self._lock:
            return self._touches.get((tenant, fkey), 0)

    def pending_of(self, tenant: str) -> dict[bytes, int]:
        """Every entry of ``tenant`` with hits noted and not written yet."""
        with self._lock:
            return {f: n for (name, f), n in self._touches.items() if name == tenant and n}

    def clear(self) -> None:
        with self._lock:
            self._touches.clear()

    def take(self) -> OrderedDict[tuple[str, bytes], int]:
        with self._lock:
            taken, self._touches = self._touches, OrderedDict()
        return taken

    def apply(
        self, txn: lmdb.Transaction, ledger: Ledger, tenant: Callable[[str], Tenant], entries: Entries
    ) -> None:
        """Write every noted read: a new clock for each entry, and its hits decayed up to now plus the
        new ones (for entries with a retention record, or all of them under a policy that uses them); an
        entry read becomes proven under a learning policy."""
        ranking = entries.ranking
        for (name, fkey), hits in self.take().items():
            owner = tenant(name)
            entry = entries.unranked(txn, owner, fkey)
            if entry is None:
                continue
            ledger.clock += 1
            if hits and (entry.ext is not None or ranking.uses_meta):
                entry.ext = entry.ext or EntryMeta()
                entry.ext.hits = ranking.decayed(entry, ledger.clock) + hits
            if hits and ranking.learning is not None and not (entry.ext and entry.ext.proven):
                ledger.count_retention(name, entry, -1)  # read: its bytes move to the proven part
                entry.ext = entry.ext or EntryMeta(hits=hits)
                entry.ext.proven = True
                ledger.count_retention(name, entry)
            entry.clock = ledger.clock
            entries.write_index(txn, ledger, owner, fkey, entry)


__all__ = ["MAX_TOUCHES", "Touches"]
