"""The vault's storage engine as one object: :class:`Store` wires the parts of this package together.

A Put batch is written in write transactions of at most ``max_bytes / 16`` bytes (one for most batches);
each first writes the recency of reads noted since the last one, makes its own room by evicting
(:mod:`.evictor`) before each write and stores the new totals in the same transaction (:mod:`.ledger`):
the budget holds at every commit and the accounting is exactly as durable as the data.

Retention (docs/concepts/retention.md): an entry past its time to live reads as a miss and is the first to
go when room is needed (the maintenance thread also clears them); a protected entry is kept out of the
eviction order while the tenant's protected bytes fit under ``max_protected_fraction`` of its quota (or of
the budget) and all tenants' under that fraction of the budget — past it, the store is kept unprotected,
counted and logged. A stored child with a parent key counts once in its parent's sharing.

A tenant with a quota evicts only its own entries to stay within it and is never evicted by another
tenant's writes; the vault budget is kept by evicting among the writer's own entries and those of tenants
without a quota (lowest rank first). Lookup leases (:mod:`tierkv.vault.leases`) keep entries a recent
PrefixLookup reported from eviction.

Time comes from one injected clock (TTL, leases), so tests move time instead of sleeping.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import lmdb

from tierkv.records import ClassStats, TenantStats
from tierkv.retention.classes import BlockMeta
from tierkv.vault.entrymeta import ClassBook, EntryMeta, Ghosts
from tierkv.vault.files import DATA_FILE, DataFileDamaged, OnDamage
from tierkv.vault.leases import LeaseTable
from tierkv.vault.policy import EvictionPolicy, Learner, LRUPolicy
from tierkv.vault.store.debug import StoreDebug
from tierkv.vault.store.entries import Entries, EntryWriter, Prepared
from tierkv.vault.store.env import StoreEnv, StoreFullError
from tierkv.vault.store.evictor import Evictor, Ranking
from tierkv.vault.store.format import entry_charge, full_key
from tierkv.vault.store.ledger import Ledger
from tierkv.vault.store.maintenance import Maintainer
from tierkv.vault.store.opening import count_retention, load_meta
from tierkv.vault.store.reads import EntryReport, Lookup, Reader, ReadTally, inspect_entry, present_run
from tierkv.vault.store.recency import Touches
from tierkv.vault.store.scans import SCAN_SLICE, ChainEntry, NamespaceUsage, chain_entries, keys_with_prefix
from tierkv.vault.store.scans import namespaces as scan_namespaces
from tierkv.vault.store.stats import PutOutcome, StoreStats, class_usage, sum_stats, tenant_usage
from tierkv.vault.store.tenants import DEFAULT_TENANT, Tenant, Tenants

log = logging.getLogger("tierkv.vault.store")

Item = tuple[bytes, bytes | bytearray | memoryview, int]
_FULL_KEY = operator.itemgetter(0)
"""A prepared item's full key."""
PURGE_BATCH = 10_000
"""The maintenance thread drops at most this many expired entries per tenant per interval."""


class Store:
    """A byte-bounded LMDB key-value store with pluggable eviction and per-tenant quotas. Thread-safe."""

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
        self.max_bytes = int(max_bytes)
        self.sync_mode = sync_mode
        self.policy: EvictionPolicy = policy or LRUPolicy()
        if not 0.0 <= max_protected_fraction <= 1.0:
            raise ValueError(f"max_protected_fraction must be in [0, 1], got {max_protected_fraction!r}")
        self.max_protected_fraction = max_protected_fraction
        self._ranking = Ranking(self.policy)
        self._entries = Entries(self._ranking)
        self._env = StoreEnv(
            self.path,
            self.max_bytes,
            durable=sync_mode == "durable",
            map_size=map_size,
            max_map_size=max_map_size,
            on_damage=on_damage,
        )
        self._tenants = Tenants(self._env, dict(tenants or {}))
        if (learning := self._ranking.learning) is not None:
            for t in self._tenants:
                t.learner = learning.learner(t.name, t.quota or self.max_bytes)
        self._leases = LeaseTable(self.max_bytes, clock=clock or time.monotonic, tenants=len(self._tenants))
        self._evictor = Evictor(self._ranking, self._entries, self._leases, self._tenants.all, self.max_bytes)
        self._writer = EntryWriter(self._entries, self._evictor, self.max_bytes, max_protected_fraction)
        self.debug = StoreDebug(self._env, self._tenants, self._leases)
        """Raw views of the LMDB databases, for tests and diagnostics (never the serving path)."""
        self._counter_lock = threading.Lock()
        self._touches = Touches()
        self.classes = ClassBook()
        self._ghosts = Ghosts()
        self.on_drop: Callable[[Sequence[tuple[str, bytes]]], None] | None = None
        """Told (tenant, full key) of every entry a committed transaction removed (prefetch hints)."""
        self._read_figures()
        chores: list[Callable[[], object]] = [self.apply_touches, self.purge_expired, self._leases.sweep]
        if sync_mode == "fast":  # durable commits are synced already
            chores.append(self.sync)
        self._maintainer = Maintainer(chores, maintenance_interval_s)

    def _read_figures(self) -> None:
        """The clock, totals and retention figures the store opens with; a page LMDB finds damaged on the
        way is :class:`DataFileDamaged` (one line), not an lmdb traceback at every start."""
        try:
            self._clock = load_meta(self._env, self._tenants, self._ranking, self.policy)
            opening = self._ledger()
            count_retention(self._env, self._tenants, opening)
        except (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadTxnError) as exc:
            self._env.close()
            raise DataFileDamaged(
                f"{self.path / DATA_FILE}: LMDB found a damaged page ({exc}); refusing to start (restore a "
                "backup, or move the directory aside to start empty)"
            ) from None
        self._commit(opening)

    # -- bookkeeping -------------------------------------------------------------------------------

    @property
    def tenant_names(self) -> list[str]:
        return self._tenants.names()

    def _ledger(self) -> Ledger:
        return Ledger(self._tenants, self._clock, self.now())

    def _save(self, txn: lmdb.Transaction, ledger: Ledger) -> None:
        ledger.save(txn, self._env.meta, self._tenants)

    def _commit(self, ledger: Ledger) -> None:
        """Take a committed transaction's figures."""
        self._clock = ledger.clock
        ledger.take_into(self._tenants, self._counter_lock)
        for learner in self._learners(ledger):  # what each learned in this transaction stands
            learner.settle()
        if ledger.ghosts:
            self._ghosts.add(ledger.ghosts)
        if ledger.dropped and self.on_drop is not None:
            self.on_drop(ledger.dropped)
        if ledger.overflow:
            self._writer.log_overflow(ledger.overflow)

    def _learners(self, ledger: Ledger) -> Iterator[Learner]:
        """The learners told of what ``ledger``'s transaction admitted or evicted."""
        for name in ledger.admitting.union(ledger.evicted):
            learner = self._tenants[name].learner
            if learner is not None:
                yield learner

    def _abandon(self, ledger: Ledger) -> None:
        """``ledger``'s transaction aborted: its learners forget it."""
        for learner in self._learners(ledger):
            learner.abandon()

    @contextlib.contextmanager
    def _transaction(self, *, evicts: bool = False) -> Iterator[tuple[lmdb.Transaction, Ledger]]:
        """A write transaction and its ledger, saved with it and taken once it committed; one that
        ``evicts`` tells the leases (lookups meanwhile must not count what it evicts as present)."""
        evicting = self._leases.writing() if evicts else contextlib.nullcontext()
        with self._env.write_lock, self._env.rw.shared(), evicting:
            ledger = self._ledger()
            with self._written(ledger) as txn:
                yield txn, ledger

    @contextlib.contextmanager
    def _written(self, ledger: Ledger) -> Iterator[lmdb.Transaction]:
        """A write transaction (the caller holds the write lock and the shared lock): ``ledger`` saved with
        it and taken once it committed; its learners told to forget it if it aborts."""
        try:
            with self._env.env.begin(write=True) as txn:
                yield txn
                self._save(txn, ledger)
        except BaseException:
            self._abandon(ledger)
            raise
        self._commit(ledger)

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
        A transaction that fails after others committed (a full disk) refuses the items from it on, so the
        outcome says what is stored; one that fails first raises (:class:`StoreFullError`).
        """
        owner = self._tenants[tenant]
        if metas is not None and len(metas) != len(items):
            raise ValueError("metas must be aligned with items")
        prepared: list[Prepared] = [
            (full_key(namespace, key), data, prio, None if metas is None else metas[i])
            for i, (key, data, prio) in enumerate(items)
        ]
        learning = self._ranking.learning
        if learning is not None:
            limit = owner.quota or self.max_bytes
            learning.observe(
                owner.name, limit, list(map(_FULL_KEY, prepared)), self._typical(owner, prepared), read=False
            )
        if learning is None or not learning.leaf_first:
            evicted, rejected = self._write_batch(owner, prepared)
        else:
            evicted, rejected = self._write_leaf_first(owner, prepared)
        return PutOutcome(stored=len(prepared) - len(rejected), rejected=rejected, evicted=evicted)

    def _write_leaf_first(self, owner: Tenant, prepared: Sequence[Prepared]) -> tuple[int, list[int]]:
        """Write ``prepared`` last item first, so the deepest block of a chain gets the oldest clock. A key
        given twice is written once, with its last blob (written in order, the earlier blob would win):
        every position of that key is stored, or refused, with it."""
        last = {item[0]: i for i, item in enumerate(prepared)}
        batch = [prepared[i] for i in sorted(last.values(), reverse=True)]
        evicted, refused = self._write_batch(owner, batch)
        refused_keys = {batch[i][0] for i in refused}
        return evicted, [i for i, item in enumerate(prepared) if item[0] in refused_keys]

    def _write_batch(self, owner: Tenant, batch: Sequence[Prepared]) -> tuple[int, list[int]]:
        """Write ``batch`` in transactions of at most ``max_bytes / 16``: the entries evicted and the
        positions refused (from a transaction that failed after others committed on, all of them)."""
        evicted = 0
        refused: list[int] = []
        with self._env.write_lock:
            for start, chunk in _chunks(batch, max(1, self.max_bytes // 16)):
                try:
                    outcome = self._env.write_retrying(
                        functools.partial(self._put_txn, owner, chunk),
                        wanted=functools.partial(_blob_bytes, chunk),
                        clock=self._clock,
                    )
                except StoreFullError as exc:
                    if not start:
                        raise  # nothing committed: the error is the whole truth
                    # earlier transactions committed: the reply must say so, and refuse only the rest
                    log.warning("a Put stored %d of %d blobs: %s", start - len(refused), len(batch), exc)
                    refused += range(start, len(batch))
                    break
                evicted += outcome.evicted
                refused += [start + i for i in outcome.rejected]
        return evicted, refused

    def _typical(self, owner: Tenant, batch: Sequence[Prepared] = ()) -> int:
        """The tenant's mean entry charge (what a learning policy's shadows charge a key they see); for a
        tenant that holds nothing yet, the mean of the ``batch`` being stored (a shadow keeps the charge a
        key came with, so the first batch must not come at 1 byte)."""
        with self._counter_lock:
            if owner.count:
                return max(1, owner.used // owner.count)
        if not batch:
            return 1
        return max(1, sum(entry_charge(fkey, data) for fkey, data, _, _ in batch) // len(batch))

    def _recency_order(self, fkeys: Sequence[bytes]) -> Sequence[bytes]:
        """Keys in the order their reads are noted: deepest first under a leaf-first policy."""
        learning = self._ranking.learning
        return fkeys[::-1] if learning is not None and learning.leaf_first else fkeys

    def _put_txn(self, owner: Tenant, items: Sequence[Prepared]) -> PutOutcome:
        """One write transaction of a Put (the caller holds the write lock and the shared lock)."""
        ledger = self._ledger()
        ledger.admitting.add(owner.name)
        rejected: list[int] = []
        with self._leases.writing(), self._written(ledger) as txn:
            self._touches.apply(txn, ledger, self._tenants.__getitem__, self._entries)
            for i, item in enumerate(items):
                if not self._writer.put_one(txn, ledger, owner, item):
                    rejected.append(i)
        evicted = sum(ledger.evicted.values())
        return PutOutcome(stored=len(items) - len(rejected), rejected=rejected, evicted=evicted)

    def delete(self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = DEFAULT_TENANT) -> int:
        owner = self._tenants[tenant]
        return self._delete_entries(owner, lambda _txn: [full_key(namespace, k) for k in keys])

    def flush(self, namespace: bytes = b"", *, tenant: str | None = None) -> int:
        """Delete every entry of ``namespace`` in ``tenant`` (default tenant when None); with no
        namespace, every entry of ``tenant``, or of every tenant when None."""
        if namespace:
            owner = self._tenants[tenant or DEFAULT_TENANT]
            prefix = full_key(namespace, b"")
            deleted = self._delete_entries(owner, lambda txn: keys_with_prefix(txn, owner, prefix))
        else:
            deleted = self._drop_tenants(self._tenants.pick(tenant))
        self._touches.clear()
        return deleted

    def _drop_tenants(self, targets: Sequence[Tenant]) -> int:
        self._leases.clear(t.name for t in targets)
        deleted = 0
        with self._transaction() as (txn, ledger):
            for t in targets:
                for db in t.databases:
                    txn.drop(db, delete=False)
                deleted += ledger.clear(t.name)
        return deleted

    def _delete_entries(self, owner: Tenant, select: Callable[[lmdb.Transaction], Sequence[bytes]]) -> int:
        """Drop the entries ``select`` names (ending their leases), in one write transaction with the new
        totals."""
        deleted = 0
        with self._transaction() as (txn, ledger):
            chosen = select(txn)
            for fkey in chosen:
                deleted += self._entries.drop(txn, ledger, owner, fkey) is not None
        self._leases.release(owner.name, chosen)
        return deleted

    # -- reads -------------------------------------------------------------------------------------

    def reader(self, tenant: str = DEFAULT_TENANT) -> Reader:
        """Reads of ``tenant``'s entries; the caller must :meth:`Reader.close` it."""
        return Reader(self._env, self._tenants[tenant], self.now(), self._after_reads)

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

    def _after_reads(self, owner: Tenant, tally: ReadTally) -> None:
        """Count hits and misses, note recency, end the leases of what was read, drop corrupt entries."""
        found = len(tally.found)
        with self._counter_lock:
            owner.hits += found
            owner.misses += tally.lookups - found
            owner.corrupt += len(tally.corrupt) + len(tally.damaged)
            owner.expired += sum(tally.expired.values())
        misses = Counter(self._ghosts.classes(owner.name, tally.missing))
        misses.update(tally.expired)
        misses[""] += len(tally.corrupt) + len(tally.damaged)
        self.classes.note(owner.name, tally.hits, +misses, tally.expired)
        self._touches.note(owner.name, self._recency_order(tally.found), hit=True)
        learning = self._ranking.learning
        if learning is not None and tally.found:
            limit = owner.quota or self.max_bytes
            learning.observe(owner.name, limit, tally.found, self._typical(owner), read=True)
        self._leases.release(owner.name, tally.found)
        if tally.corrupt:
            corrupt = tally.corrupt
            log.warning("dropping %d corrupt entries", len(corrupt))
            self._delete_entries(owner, lambda _txn: corrupt)
        if tally.damaged:
            self._forget_damaged(owner, tally.damaged)

    def _forget_damaged(self, owner: Tenant, fkeys: Sequence[bytes]) -> None:
        """Entries whose blob LMDB cannot read: out of the index, the totals and the eviction order, so
        eviction never picks them (deleting the blob's record would read the damaged page and fail every
        write that needs room); their blobs' records stay behind."""
        log.error(
            "%s is damaged: LMDB cannot read %d entries, now misses; restore a backup or set the directory "
            "aside when convenient (a Put of the same key fails until then)",
            self.path / DATA_FILE,
            len(fkeys),
        )
        try:
            with self._transaction() as (txn, ledger):
                for fkey in fkeys:
                    self._entries.drop(txn, ledger, owner, fkey, keep_data=True)
        except lmdb.Error as exc:  # the damage is in the index itself
            log.error("could not set the damaged entries aside: %s", exc)

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
        owner = self._tenants[tenant]
        since = self._leases.mark() if lease_ms > 0 else 0
        present = present_run(self._env, owner, namespace, keys, self.now())
        if lease_ms > 0 and present:
            present = present[
                : self._leases.grant(owner.name, present, lease_ms, since=since, quota=owner.quota)
            ]
        self._touches.note(owner.name, self._recency_order([fkey for fkey, _ in present]), hit=False)
        return len(present)

    def entry(self, namespace: bytes, key: bytes, *, tenant: str = DEFAULT_TENANT) -> EntryMeta | None:
        """One entry's retention figures (class, importance, expiry, decayed hits, stored children,
        protected); an entry without a retention record reads as the defaults; None if absent."""
        report = self.inspect(namespace, key, tenant=tenant)
        return None if report.status is Lookup.MISSING else report.meta or EntryMeta()

    def inspect(self, namespace: bytes, key: bytes, *, tenant: str = DEFAULT_TENANT) -> EntryReport:
        """One entry as stored, checksum verified, without counting a hit or moving its recency."""
        owner = self._tenants[tenant]
        fkey = full_key(namespace, key)
        return inspect_entry(
            self._env,
            owner,
            fkey,
            lambda entry: self._ranking.decayed(entry, self._clock) + self._touches.pending(owner.name, fkey),
        )

    def namespaces(
        self, tenant: str | None = None, *, limit: int = 10_000
    ) -> tuple[list[NamespaceUsage], bool]:
        """Every namespace of ``tenant`` (of every tenant when None), in key order, with its figures;
        True with them when there were more than ``limit``. Reads the whole index, in short read
        transactions: an operator's question, not the serving path."""
        return scan_namespaces(self._env, self._tenants.pick(tenant), limit)

    def chain_entries(
        self, namespace: bytes, *, tenant: str = DEFAULT_TENANT, limit: int = SCAN_SLICE
    ) -> list[ChainEntry]:
        """Entries of ``namespace`` that have a retention record (at most ``limit``, of the first ``limit``
        index records), with their decayed hits (reads not yet written included) and parent. Reads the
        index in short read transactions; for :mod:`tierkv.vault.hottest`, not the serving path."""
        owner = self._tenants[tenant]
        pending = self._touches.pending_of(owner.name)
        clock = self._clock
        return chain_entries(
            self._env,
            owner,
            namespace,
            limit,
            lambda entry, fkey: self._ranking.decayed(entry, clock) + pending.get(fkey, 0),
        )

    def tokens_of(
        self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = DEFAULT_TENANT
    ) -> list[bytes | None]:
        """The token ids stored with each key (packed int32), None where there are none."""
        owner = self._tenants[tenant]
        with self._env.read(buffers=False) as txn:
            found = [txn.get(full_key(namespace, k), db=owner.tokens) for k in keys]
        return [None if v is None else bytes(v) for v in found]

    # -- maintenance (:class:`Maintainer` runs these each interval) ---------------------------------

    def apply_touches(self) -> None:
        """Write pending recency updates now (the maintenance thread does this every interval)."""
        if not self._touches:
            return
        with self._transaction() as (txn, ledger):
            self._touches.apply(txn, ledger, self._tenants.__getitem__, self._entries)

    def purge_expired(self, limit: int = PURGE_BATCH) -> int:
        """Drop up to ``limit`` expired entries per tenant (the maintenance thread calls this each
        interval); returns how many went. A read transaction first, so a store without any opens no
        write transaction."""
        now = self.now()
        with self._env.read() as txn:
            due = [t for t in self._tenants if self._evictor.first_expired(txn, t, now) is not None]
        if not due:
            return 0
        with self._transaction(evicts=True) as (txn, ledger):
            self._evictor.purge(txn, ledger, due, limit)
        return sum(ledger.evicted.values())

    # -- figures and lifecycle ---------------------------------------------------------------------

    def stats(self, tenant: str | None = None) -> StoreStats:
        """The whole store's figures (the sum of its tenants'), or one tenant's (its quota, when it has
        one, as ``max_bytes``)."""
        map_size = self._env.map_size
        picked = self._tenants.pick(tenant)
        limit = self.max_bytes if tenant is None else min(self.max_bytes, picked[0].quota or self.max_bytes)
        with self._counter_lock:
            return sum_stats(picked, limit, map_size, self._leases.counts(t.name for t in picked))

    def tenant_usage(self) -> list[TenantStats]:
        with self._counter_lock:
            return tenant_usage(self._tenants.all())

    def class_usage(self, tenant: str | None = None) -> list[ClassStats]:
        """Per tenant (all, or one) and source class: stored keys and bytes, lookups, 5-minute window.
        Class ``""`` holds untagged entries and misses of unknown class."""
        return class_usage(self._tenants.all(), self.classes, tenant, self._counter_lock)

    def sync(self) -> None:
        self._env.sync()

    def close(self) -> None:
        """Write pending recency, fsync and close. Idempotent."""
        if not self._maintainer.stop():
            return
        try:
            self.apply_touches()
        except lmdb.Error as exc:  # a damaged page: the recency is lost, the data is what it was
            log.error("could not write pending recency to %s: %s", self.path / DATA_FILE, exc)
        try:
            self._env.sync()
        finally:
            self._env.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _blob_bytes(items: Sequence[Prepared]) -> int:
    return sum(len(item[1]) for item in items)


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


__all__ = ["PURGE_BATCH", "Item", "Store"]
