"""Eviction: the one place the store consults its policy, and the victim search inside a write transaction.

:class:`Ranking` asks the policy (:mod:`tierkv.vault.policy`) for an entry's rank, whether it keeps
retention records for every entry, and what an entry's hits are worth now; the ``order`` database is
kept in that rank. :class:`Evictor` makes room for a write: in the writer's own entries while its quota
is short, then among the writer's and quota-less tenants' entries while the budget is — an expired entry
first, else the lowest-ranked entry that no lookup lease holds (walking past at most as many entries as
the tenant holds leases; with none left the write is refused, so the budget holds exactly). Protected
entries are not in the order and never go; deletes and flushes ignore leases.

Under a learning policy (``adaptive``) the order has parts (the first byte of a rank): each tenant's
learner says at which part the victim search starts (:meth:`Evictor.walk_start`), is told of every
admission and eviction, and an entry's ``proven`` flag moves its bytes between the ledger's parts.

Everything here takes the write transaction and its :class:`~tierkv.vault.store.ledger.Ledger` (whose
``now`` is the injected clock's reading), so an evictor is tested directly on a transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import lmdb

from tierkv.vault.leases import LeaseTable
from tierkv.vault.policy import ContextPolicy, EntryInfo, EvictionPolicy, as_learning
from tierkv.vault.store.format import IndexRecord, expiry_ms
from tierkv.vault.store.ledger import Ledger
from tierkv.vault.store.tenants import Tenant

if TYPE_CHECKING:
    from tierkv.vault.store.entries import Entries


_info = tuple.__new__
_NO_EXT = EntryInfo(0, 0)[3:]
"""An entry's :class:`EntryInfo` fields after the priority when it has no retention record: the defaults."""


class Ranking:
    """What the policy says about entries: their rank in the ``order`` database and their hits now."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.learning = as_learning(policy)
        self.rank_len = len(policy.rank(EntryInfo(clock=0, size=0, priority=0)))
        self.uses_meta = policy.uses_meta
        """Every entry gets a retention record (hits, sharing) even when stored untagged."""

    @property
    def name(self) -> str:
        return self.policy.name

    def rank(self, entry: IndexRecord) -> bytes:
        """The entry's rank. Its :class:`EntryInfo` is made with ``tuple.__new__``, a quarter of what the
        named tuple's own constructor costs (this runs for every entry written, read back or evicted)."""
        ext = entry.ext
        if ext is None:
            return self.policy.rank(_info(EntryInfo, (entry.clock, entry.charge, entry.priority, *_NO_EXT)))
        fields = (ext.importance, ext.hits, ext.sharing, ext.population, ext.proven)
        return self.policy.rank(_info(EntryInfo, (entry.clock, entry.charge, entry.priority, *fields)))

    def decayed(self, entry: IndexRecord, clock: int) -> float:
        """The entry's hit count now: halved per ``hit_half_life`` turnovers under ``context``, else kept."""
        ext = entry.ext
        if ext is None:
            return 0.0
        if not isinstance(self.policy, ContextPolicy):
            return ext.hits
        return self.policy.decayed_hits(ext.hits, clock - entry.clock, ext.population)

    def rerank(self, txn: lmdb.Transaction, tenant: Tenant) -> None:
        """Rebuild the tenant's order from its index (the store was ranked by another policy)."""
        txn.drop(tenant.order, delete=False)
        with txn.cursor(db=tenant.index) as cur:
            for fkey, raw in cur:
                entry = IndexRecord.unpack(raw)
                if not entry.protected:
                    txn.put(self.rank(entry) + bytes(fkey), b"", db=tenant.order)


class Evictor:
    """Makes room in a write transaction; the leases decide what may not go yet."""

    def __init__(
        self,
        ranking: Ranking,
        entries: Entries,
        leases: LeaseTable,
        tenants: Callable[[], Sequence[Tenant]],
        max_bytes: int,
    ) -> None:
        self.ranking = ranking
        self.entries = entries
        self.leases = leases
        self.tenants = tenants
        self.max_bytes = max_bytes
        self._sharing: dict[str, tuple[Tenant, ...]] = {}
        """Per writer, the other tenants without a quota (whose entries its writes may evict)."""

    def make_room(self, txn: lmdb.Transaction, ledger: Ledger, owner: Tenant, charge: int) -> bool:
        """Evict until ``charge`` more bytes fit the owner's quota and the vault budget."""
        while owner.quota and ledger.used[owner.name] + charge > owner.quota:
            if not self.evict_one(txn, ledger, owner):
                return False
        while ledger.total + charge > self.max_bytes:
            victim = self.victim(txn, ledger, owner)
            if victim is None or not self.evict_one(txn, ledger, victim):
                return False
        return True

    def victim(self, txn: lmdb.Transaction, ledger: Ledger, owner: Tenant) -> Tenant | None:
        """Whose entry goes: the owner's or a quota-less tenant's — one with an expired entry first, else
        whichever's lowest-ranked unleased entry ranks lower."""
        others = self._sharing.get(owner.name)
        if others is None:
            others = self._sharing[owner.name] = tuple(
                t for t in self.tenants() if t is not owner and not t.quota
            )
        if not others:
            return owner
        best: tuple[bytes, Tenant] | None = None
        for t in (owner, *others):
            if self.first_expired(txn, t, ledger.now) is not None:
                return t
            with txn.cursor(db=t.order) as cur:
                key = self.first_evictable(cur, ledger, t, self.unleased, self.walk_start(cur, ledger, t))
                if key is not None:
                    rank = key[: self.ranking.rank_len]
                    if best is None or rank < best[0]:
                        best = (rank, t)
        return None if best is None else best[1]

    def unleased(self, tenant: str, fkey: bytes) -> bool:
        """No live lease holds the entry: the victim search's question, which (unlike
        :meth:`LeaseTable.claim`) neither counts an honoured lease nor claims the entry."""
        return not self.leases.leased(tenant, fkey)

    @staticmethod
    def first_expired(txn: lmdb.Transaction, tenant: Tenant, now: float) -> bytes | None:
        """The full key of the tenant's soonest-expiring entry if it has expired by ``now``."""
        with txn.cursor(db=tenant.expiry) as cur:
            if not cur.first():
                return None
            key = bytes(cur.key())
        return key[8:] if expiry_ms(key) <= int(now * 1000) else None

    def evict_one(self, txn: lmdb.Transaction, ledger: Ledger, tenant: Tenant) -> bool:
        """Drop the tenant's first expired entry, else its lowest-ranked one; False when it has neither."""
        victim_fkey = self.first_expired(txn, tenant, ledger.now)
        expired = victim_fkey is not None
        if victim_fkey is not None:
            self.leases.claim(tenant.name, victim_fkey, force=True)
        else:
            with txn.cursor(db=tenant.order) as order:
                start = self.walk_start(order, ledger, tenant)
                key = self.first_evictable(order, ledger, tenant, self.leases.claim, start)
                if key is None:
                    return False
                victim_fkey = key[self.ranking.rank_len :]
                order.delete()
        victim = self.entries.drop(txn, ledger, tenant, victim_fkey, ordered=expired)
        if victim is None:  # an order or expiry key without its entry: drop the stray key
            with txn.cursor(db=tenant.expiry) as cur:
                if expired and cur.first():
                    cur.delete()
            return True
        ledger.evicted[tenant.name] += 1
        ext = victim.ext
        learner = tenant.learner
        if learner is not None:
            learner.evicted((victim_fkey, victim.charge, ext is not None and ext.proven))
        if ext is not None and ext.source:
            ledger.ghosts.append((tenant.name, victim_fkey, ext.source))
        return True

    @staticmethod
    def walk_start(cur: lmdb.Cursor, ledger: Ledger, tenant: Tenant) -> bytes:
        """Where the victim search starts: the part the tenant's learner names (given the bytes in each
        part in this transaction and, asked only when needed, the clocks of each part's oldest entry),
        else the start of the order."""
        learner = tenant.learner
        if learner is None:
            return b""
        name = tenant.name
        main = ledger.proven[name]
        start = learner.walk_from(ledger.used[name] - ledger.protected[name] - main, main)
        return learner.walk_by_heads(*_part_heads(cur)) if start is None else start

    def first_evictable(
        self,
        cur: lmdb.Cursor,
        ledger: Ledger,
        tenant: Tenant,
        free: Callable[[str, bytes], bool],
        start: bytes = b"",
    ) -> bytes | None:
        """The tenant's lowest-ranked order key from ``start`` on that ``free`` says no lease holds, with
        ``cur`` on it; walks past at most as many keys as the tenant holds leases (none left within that
        from ``start``: the walk is made again from the first key, and None when none is left there).
        Within one transaction a walk resumes where the last one from the same start ended (an entry it
        passed whose lease ended since is left for the next transaction), so a flood of puts walks a run
        of leased entries once per transaction, not once per eviction."""
        name = tenant.name
        resume = ledger.past_leases.get((name, start)) if ledger.past_leases else None
        at = resume or start
        found = cur.set_range(at) if at else cur.first()
        rank_len = self.ranking.rank_len
        for walked in range(self.leases.held(name) + 1):
            if not found:
                break
            key = bytes(cur.key())
            if free(name, key[rank_len:]):
                if walked:
                    ledger.past_leases[(name, start)] = key
                return key
            found = cur.next()
        return self.first_evictable(cur, ledger, tenant, free) if start else None

    def purge(self, txn: lmdb.Transaction, ledger: Ledger, due: Sequence[Tenant], limit: int) -> None:
        """Drop up to ``limit`` expired entries of each tenant in ``due``."""
        for t in due:
            for _ in range(limit):
                if self.first_expired(txn, t, ledger.now) is None:
                    break
                self.evict_one(txn, ledger, t)


def _part_heads(cur: lmdb.Cursor) -> tuple[int | None, int | None]:
    """The clocks of the oldest entry in each of the order's two parts (a rank's first byte, then the
    clock), None for an empty part; moves ``cur``."""
    found: list[int | None] = []
    for part in (b"\x00", b"\x01"):
        key = bytes(cur.key()) if cur.set_range(part) else b""
        found.append(int.from_bytes(key[1:9], "big") if key[:1] == part else None)
    return found[0], found[1]


__all__ = ["Evictor", "Ranking"]
