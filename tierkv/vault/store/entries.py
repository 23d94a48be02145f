"""Writing and removing one entry inside a write transaction, with everything that hangs off it.

An entry is its blob (``data``), its index record, its order key (unless protected), its expiry key (with
a time to live), its token ids and its count in its parent's sharing. :class:`Entries` keeps those
together and books every change in the transaction's ledger; :class:`EntryWriter` decides what a Put
writes: the charge against quota and budget (room made by the evictor), the retention tail (protected
only within the caps; hits and children carried over from the entry it replaces).
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import lmdb

from tierkv.retention.classes import NEUTRAL_IMPORTANCE, BlockMeta, pack_tokens
from tierkv.vault.entrymeta import EntryMeta
from tierkv.vault.store.evictor import Evictor, Ranking
from tierkv.vault.store.format import (
    INDEX_SIZE,
    IndexRecord,
    checksum,
    entry_charge,
    expiry_key,
    parent_key,
)
from tierkv.vault.store.ledger import Ledger
from tierkv.vault.store.tenants import Tenant

log = logging.getLogger(__name__)

Prepared = tuple[bytes, bytes | bytearray | memoryview, int, BlockMeta | None]
"""(full key, blob, priority, retention metadata) of one item of a Put."""
OVERFLOW_LOG_INTERVAL_S = 60.0


class Entries:
    """The records of one entry, written, re-ranked and removed together."""

    def __init__(self, ranking: Ranking) -> None:
        self.ranking = ranking

    def write_index(
        self, txn: lmdb.Transaction, ledger: Ledger, owner: Tenant, fkey: bytes, entry: IndexRecord
    ) -> None:
        """Write the index record and (unless protected) its order key, ranked at today's population;
        the caller has deleted the entry's previous order key."""
        if entry.ext is None and self.ranking.uses_meta:
            entry.ext = EntryMeta()
        if entry.ext is not None:
            entry.ext.population = max(1, ledger.population)
        txn.put(fkey, entry.pack(), db=owner.index)
        if not entry.protected:
            txn.put(self.ranking.rank(entry) + fkey, b"", db=owner.order)

    def unranked(self, txn: lmdb.Transaction, owner: Tenant, fkey: bytes) -> IndexRecord | None:
        """A stored entry taken out of the eviction order, to be changed and written back with
        :meth:`write_index`; None when it is missing or its record is unreadable."""
        raw = txn.get(fkey, db=owner.index)
        if raw is None:
            return None
        try:
            entry = IndexRecord.unpack(raw)
        except ValueError:
            return None
        if not entry.protected:
            txn.delete(self.ranking.rank(entry) + fkey, db=owner.order)
        return entry

    def adjust_sharing(
        self, txn: lmdb.Transaction, ledger: Ledger, owner: Tenant, parent: bytes, delta: int
    ) -> bool:
        """A stored child of ``parent`` came or went: count it in the parent and re-rank it; False when
        the parent is not stored."""
        entry = self.unranked(txn, owner, parent)
        if entry is None:
            return False
        entry.ext = entry.ext or EntryMeta()
        entry.ext.sharing = max(0, entry.ext.sharing + delta)
        self.write_index(txn, ledger, owner, parent, entry)
        return True

    def drop(
        self,
        txn: lmdb.Transaction,
        ledger: Ledger,
        owner: Tenant,
        fkey: bytes,
        *,
        ordered: bool = True,
        keep_data: bool = False,
    ) -> IndexRecord | None:
        """Remove an entry (and its order key unless the caller already did, its expiry key and its
        parent's count of children), booked in ``ledger``. ``keep_data`` leaves the blob's record where
        LMDB cannot delete it (a damaged page): the entry is gone for reads, accounting and eviction."""
        raw = txn.get(fkey, db=owner.index)
        if raw is None:
            return None
        entry = IndexRecord.lenient(raw)  # a damaged record: charge what its fixed part says, if anything
        if len(raw) < INDEX_SIZE:  # not even that: what the entry's records weigh is its charge
            data, tokens = txn.get(fkey, db=owner.data), txn.get(fkey, db=owner.tokens)
            entry.charge = entry_charge(fkey, data or b"", bytes(tokens or b""))
        if ordered and not entry.protected:
            txn.delete(self.ranking.rank(entry) + fkey, db=owner.order)
        txn.delete(fkey, db=owner.index)
        if not keep_data:
            txn.delete(fkey, db=owner.data)
        txn.delete(fkey, db=owner.tokens)
        ledger.remove(owner.name, entry)
        ledger.dropped.append((owner.name, fkey))
        ext = entry.ext
        if ext is not None and ext.expiry:
            txn.delete(expiry_key(ext.expiry, fkey), db=owner.expiry)
        if ext is not None and ext.parent:
            self.adjust_sharing(txn, ledger, owner, parent_key(fkey, ext.parent), -1)
        return entry


class EntryWriter:
    """One Put item at a time: make room, then write the entry with its retention tail."""

    def __init__(
        self, entries: Entries, evictor: Evictor, max_bytes: int, max_protected_fraction: float
    ) -> None:
        if not 0.0 <= max_protected_fraction <= 1.0:
            raise ValueError(f"max_protected_fraction must be in [0, 1], got {max_protected_fraction!r}")
        self.entries = entries
        self.evictor = evictor
        self.max_bytes = max_bytes
        self.max_protected_fraction = max_protected_fraction
        self._overflow_logged = 0.0

    def put_one(self, txn: lmdb.Transaction, ledger: Ledger, owner: Tenant, item: Prepared) -> bool:
        """Write one entry after making room for it; False when it cannot fit (the item is rejected)."""
        fkey, data, priority, meta = item
        tokens = pack_tokens(meta.tokens) if meta is not None and meta.tokens else b""
        charge = entry_charge(fkey, data, tokens)
        if charge > min(self.max_bytes, owner.quota or self.max_bytes):
            return False
        old = self.entries.drop(txn, ledger, owner, fkey)
        learner = owner.learner  # whether it starts proven: as it was when it replaces itself, else as
        if learner is None:  # the tenant's learner admits it (never, under a policy that does not learn)
            proven = False
        elif old is not None:
            proven = old.ext is not None and old.ext.proven
        else:
            proven = learner.admit(fkey, charge, NEUTRAL_IMPORTANCE if meta is None else meta.importance)
        if not self.evictor.make_room(txn, ledger, owner, charge):
            return False
        ledger.clock += 1
        entry = IndexRecord(charge, ledger.clock, priority, checksum(fkey, data))
        entry.ext = self._entry_meta(ledger, owner, charge, meta, old)
        if proven:
            entry.ext = entry.ext or EntryMeta()
            entry.ext.proven = True
        children = ledger.orphans.pop((owner.name, fkey), 0)
        if children:
            entry.ext = entry.ext or EntryMeta()
            entry.ext.sharing += children
        txn.put(fkey, data, db=owner.data)
        if tokens:
            txn.put(fkey, tokens, db=owner.tokens)
        self.entries.write_index(txn, ledger, owner, fkey, entry)
        if entry.ext is not None and entry.ext.expiry:
            txn.put(expiry_key(entry.ext.expiry, fkey), b"", db=owner.expiry)
        ledger.add(owner.name, entry)
        if entry.ext is not None and entry.ext.parent:
            parent = parent_key(fkey, entry.ext.parent)
            if not self.entries.adjust_sharing(txn, ledger, owner, parent, 1):
                ledger.orphans[(owner.name, parent)] += 1
        return True

    def _entry_meta(
        self, ledger: Ledger, owner: Tenant, charge: int, meta: BlockMeta | None, old: IndexRecord | None
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

    def _protected_fits(self, ledger: Ledger, owner: Tenant, charge: int) -> bool:
        """``charge`` more protected bytes stay under the tenant's cap and the vault's."""
        fraction = self.max_protected_fraction
        tenant_cap = fraction * min(self.max_bytes, owner.quota or self.max_bytes)
        return (
            ledger.protected[owner.name] + charge <= tenant_cap
            and ledger.protected_total + charge <= fraction * self.max_bytes
        )

    def log_overflow(self, overflow: Counter[str]) -> None:
        """Say (at most once a minute) that protected stores were kept unprotected at the cap."""
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


__all__ = ["Entries", "EntryWriter", "Prepared"]
