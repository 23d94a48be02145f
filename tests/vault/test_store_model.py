"""The store's eviction decision, model-based: random Puts, reads, deletes, leases and their expiry, quotas,
protected and TTL entries from one to four tenants, run against the real `Store` on LMDB and checked
after every step against an independent model of what must be present, the exact bytes used and who may
be evicted.

The model does not replay the store's algorithm. It knows the promises: an entry is charged namespace +
key + blob; a Put that fits its tenant's quota and the budget is stored whenever evicting what may be
evicted makes room (else it is rejected, and says so); only entries of the writer, or of tenants without
a quota when the budget is short, may go — never one under a live lease or protected, unless it has
expired; nothing goes when the Put fits as it is; a read returns exactly the bytes stored unless the entry
expired; a leased lookup reports the leading run present, its leases hold until they end or the tenant
reads the entries; a write transaction that fails (an I/O error injected into it) leaves nothing behind,
and the Put's reply names what the transactions before it stored. Which of several permitted victims
goes (recency order) is the policy's business and is checked elsewhere; here every disappearance must be
permitted.

``TIERKV_MODEL_EXAMPLES`` raises the example count (default 60; try 2000 for a longer profile).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from tempfile import TemporaryDirectory

import lmdb
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tierkv.retention.classes import BlockMeta
from tierkv.vault.leases import MAX_LEASE_MS
from tierkv.vault.policy import AdaptivePolicy, EvictionPolicy, LRUPolicy
from tierkv.vault.store import DEFAULT_TENANT, Lookup, Store, StoreFullError

BUDGET = 12_000
NS = b"ns"
KEYS = [b"k%02d" % i for i in range(24)]
PROTECTED_FRACTION = 0.5
EXAMPLES = int(os.environ.get("TIERKV_MODEL_EXAMPLES", "60"))


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@dataclasses.dataclass
class Entry:
    data: bytes
    protected: bool
    expiry: float  # 0: none

    @property
    def charge(self) -> int:
        return len(NS) + len(KEYS[0]) + len(self.data)


@dataclasses.dataclass
class Tenant:
    name: str
    quota: int
    entries: dict[bytes, Entry] = dataclasses.field(default_factory=dict)
    leases: dict[bytes, float] = dataclasses.field(default_factory=dict)

    @property
    def used(self) -> int:
        return sum(e.charge for e in self.entries.values())

    @property
    def protected(self) -> int:
        return sum(e.charge for e in self.entries.values() if e.protected)


class StoreModel(RuleBasedStateMachine):
    policy: type[EvictionPolicy] = LRUPolicy

    def __init__(self) -> None:
        super().__init__()
        self.tmp = TemporaryDirectory()
        self.clock = FakeClock()
        self.store: Store | None = None
        self.tenants: dict[str, Tenant] = {}
        self.serial = 0

    # -- set-up ------------------------------------------------------------------------------------

    @initialize(
        quotas=st.lists(st.sampled_from([0, 0, 4_000, 7_000]), min_size=0, max_size=3),
        default_quota=st.sampled_from([0, 0, 5_000]),
    )
    def open_store(self, quotas: list[int], default_quota: int) -> None:
        names = [DEFAULT_TENANT, *(f"t{i}" for i in range(len(quotas)))]
        quota_of = dict(zip(names, [default_quota, *quotas], strict=True))
        self.store = Store(
            Path(self.tmp.name) / "v",
            BUDGET,
            sync_mode="fast",
            maintenance_interval_s=1e6,  # the model runs maintenance itself
            tenants=quota_of,
            max_protected_fraction=PROTECTED_FRACTION,
            clock=self.clock,
            policy=self.policy(),
        )
        self.tenants = {n: Tenant(n, q) for n, q in quota_of.items()}

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        self.tmp.cleanup()

    # -- model helpers -----------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.clock.t

    def expired(self, e: Entry) -> bool:
        return 0 < e.expiry <= self.now

    def leased(self, t: Tenant, key: bytes) -> bool:
        return t.leases.get(key, 0.0) > self.now

    def evictable(self, t: Tenant, key: bytes) -> bool:
        e = t.entries[key]
        return self.expired(e) or not (e.protected or self.leased(t, key))

    def evictable_bytes(self, t: Tenant, skip: bytes | None = None) -> int:
        return sum(e.charge for k, e in t.entries.items() if k != skip and self.evictable(t, k))

    def must_store(self, owner: Tenant, key: bytes, charge: int) -> bool:
        """Whether evicting what may be evicted makes room (the old entry under ``key`` goes first)."""
        cap = min(BUDGET, owner.quota or BUDGET)
        if charge > cap:
            return False
        old = owner.entries[key].charge if key in owner.entries else 0
        over_quota = owner.used - old + charge - owner.quota if owner.quota else 0
        if over_quota > self.evictable_bytes(owner, skip=key):
            return False
        total = sum(t.used for t in self.tenants.values()) - old
        pool = self.evictable_bytes(owner, skip=key) + sum(
            self.evictable_bytes(t) for t in self.tenants.values() if t is not owner and not t.quota
        )
        return total + charge - BUDGET <= pool

    def fits_now(self, owner: Tenant, key: bytes, charge: int) -> bool:
        old = owner.entries[key].charge if key in owner.entries else 0
        total = sum(t.used for t in self.tenants.values()) - old
        quota_ok = not owner.quota or owner.used - old + charge <= owner.quota
        return quota_ok and total + charge <= BUDGET

    def protection_fits(self, owner: Tenant, charge: int) -> bool:
        """Protection is granted while the tenant's and the vault's protected bytes stay under their caps
        (asked once the old entry and the victims are gone)."""
        total = sum(t.protected for t in self.tenants.values())
        tenant_cap = PROTECTED_FRACTION * min(BUDGET, owner.quota or BUDGET)
        return owner.protected + charge <= tenant_cap and total + charge <= PROTECTED_FRACTION * BUDGET

    def observe(self, t: Tenant, key: bytes) -> bool:
        assert self.store is not None
        report = self.store.inspect(NS, key, tenant=t.name)
        assert report.status is not Lookup.CORRUPT
        return report.status is Lookup.FOUND

    def reconcile(self, writer: Tenant | None, written: set[bytes], room_needed: bool) -> None:
        """Drop from the model what the store no longer holds, checking each loss was permitted."""
        for t in self.tenants.values():
            for key in list(t.entries):
                if self.observe(t, key):
                    continue
                if not (t is writer and key in written):
                    assert writer is not None and room_needed, f"{t.name}/{key!r} vanished with no need"
                    assert self.evictable(t, key), f"{t.name}/{key!r} evicted while leased or protected"
                    assert t is writer or not t.quota, f"{writer.name} evicted {t.name}'s {key!r} (quota)"
                del t.entries[key]
                t.leases.pop(key, None)

    # -- rules -------------------------------------------------------------------------------------

    tenant_ix = st.integers(0, 3)

    def pick(self, i: int) -> Tenant:
        return list(self.tenants.values())[i % len(self.tenants)]

    @rule(
        ti=tenant_ix,
        key=st.sampled_from(KEYS),
        size=st.sampled_from([200, 900, 1_500, 2_600, 4_500, 13_000]),
        protected=st.booleans(),
        ttl=st.sampled_from([None, None, 5.0, 60.0]),
    )
    def put_one(self, ti: int, key: bytes, size: int, protected: bool, ttl: float | None) -> None:
        assert self.store is not None
        owner = self.pick(ti)
        self.serial += 1
        data = bytes([self.serial % 251]) * size
        entry = Entry(data, False, self.now + ttl if ttl else 0.0)
        charge = entry.charge
        expect = self.must_store(owner, key, charge)
        fits = self.fits_now(owner, key, charge)
        meta = BlockMeta(source="chat", protected=protected, ttl_s=ttl) if protected or ttl else None
        outcome = self.store.put_many(
            NS, [(key, data, 0)], tenant=owner.name, metas=None if meta is None else [meta]
        )
        assert outcome.stored == int(expect), f"stored {outcome.stored}, the model says {int(expect)}"
        assert outcome.rejected == ([] if expect else [0])
        self.reconcile(owner, {key}, room_needed=not fits)
        # a lease outlives a re-put of its key (same key, same block); a rejected re-put may have dropped
        # the old entry (reconcile took it out of the model then) or, too large to ever fit, left it
        if expect:
            assert self.observe(owner, key)
            owner.entries.pop(key, None)
            entry.protected = protected and self.protection_fits(owner, charge)
            owner.entries[key] = entry
            got = self.store.entry(NS, key, tenant=owner.name)
            assert got is not None and got.protected == entry.protected

    @rule(ti=tenant_ix, keys=st.lists(st.sampled_from(KEYS), min_size=2, max_size=5, unique=True))
    def put_batch(self, ti: int, keys: list[bytes]) -> None:
        """Several entries in one call: whatever the store says it stored is there (unless a later one of
        the same batch had to evict it), what it rejected is not."""
        assert self.store is not None
        owner = self.pick(ti)
        items = [(k, bytes([(self.serial + i) % 251]) * 700, 0) for i, k in enumerate(keys)]
        self.serial += len(keys)
        outcome = self.store.put_many(NS, items, tenant=owner.name)
        assert outcome.stored + len(outcome.rejected) == len(keys)
        self.reconcile(owner, set(keys), room_needed=True)
        for i, (key, data, _) in enumerate(items):
            owner.entries.pop(key, None)
            if i in outcome.rejected:
                assert not self.observe(owner, key)
            elif self.observe(owner, key):
                owner.entries[key] = Entry(data, False, 0.0)

    @rule(
        ti=tenant_ix,
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True),
        fail_at=st.integers(0, 3),
        written=st.booleans(),
    )
    def put_failing(self, ti: int, keys: list[bytes], fail_at: int, written: bool) -> None:
        """A Put whose write fails part-way (an I/O error LMDB reports, the disk not full): the transaction
        that failed leaves nothing behind — none of its blobs stored, none it evicted gone, the bytes, the
        leases and the learner as before, which the steps after it check — and the reply names exactly the
        blobs the transactions before it stored. Each blob here is a transaction of its own (a Put's are at
        most a sixteenth of the budget); ``written``: the failing one fails after its blob was written."""
        assert self.store is not None
        owner = self.pick(ti)
        items = [(k, bytes([(self.serial + i) % 251]) * 700, 0) for i, k in enumerate(keys)]
        self.serial += len(keys)
        fail_at %= len(keys)
        learning = self.store._ranking.learning
        order = list(range(len(keys)))[:: -1 if learning is not None and learning.leaf_first else 1]
        writer = self.store._writer
        real, calls = writer.put_one, [0]

        def failing(*args: object) -> bool:
            calls[0] += 1
            if calls[0] == fail_at + 1:
                if written:
                    real(*args)  # type: ignore[arg-type]
                raise lmdb.Error("injected: Input/output error")
            return real(*args)  # type: ignore[arg-type]

        writer.put_one = failing  # type: ignore[method-assign]
        try:
            if fail_at == 0:
                with pytest.raises(StoreFullError):
                    self.store.put_many(NS, items, tenant=owner.name)
                self.reconcile(None, set(), room_needed=False)  # nothing may have gone
                return
            outcome = self.store.put_many(NS, items, tenant=owner.name)
        finally:
            del writer.put_one
        refused = set(order[fail_at:])  # the failed transaction's blob and those after it
        assert refused <= set(outcome.rejected), (outcome, order, fail_at)
        attempted = {keys[i] for i in order[:fail_at]}  # committed: stored, or rejected for want of room
        self.reconcile(owner, attempted, room_needed=True)
        for i, (key, data, _) in enumerate(items):
            if key in attempted:
                owner.entries.pop(key, None)
                if i in outcome.rejected:
                    assert not self.observe(owner, key)
                elif self.observe(owner, key):
                    owner.entries[key] = Entry(data, False, 0.0)
            elif key in owner.entries:  # refused: the blob it had before, if none of the stored evicted it
                assert self.store.get_many(NS, [key], tenant=owner.name)[0] == owner.entries[key].data

    @rule(ti=tenant_ix, keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
    def read(self, ti: int, keys: list[bytes]) -> None:
        assert self.store is not None
        t = self.pick(ti)
        got = self.store.get_many(NS, keys, tenant=t.name)
        for key, value in zip(keys, got, strict=True):
            e = t.entries.get(key)
            if e is None or self.expired(e):
                assert value is None, f"{t.name}/{key!r} read though absent or expired"
            else:
                assert value == e.data
                t.leases.pop(key, None)  # a read by the tenant ends its lease

    @rule(
        ti=tenant_ix,
        start=st.integers(0, len(KEYS) - 1),
        n=st.integers(1, 6),
        ms=st.sampled_from([0, 2_000, MAX_LEASE_MS]),
    )
    def lookup(self, ti: int, start: int, n: int, ms: int) -> None:
        assert self.store is not None
        t = self.pick(ti)
        keys = KEYS[start : start + n]
        run = 0
        for key in keys:
            e = t.entries.get(key)
            if e is None or self.expired(e):
                break
            run += 1
        found = self.store.prefix_lookup(NS, keys, tenant=t.name, lease_ms=ms)
        if ms == 0:
            assert found == run
        else:
            assert found <= run
            if not any(x.leases for x in self.tenants.values()) and found < run:
                leased = sum(t.entries[k].charge for k in keys[:run])
                share = 0.25 * min(t.quota or BUDGET, BUDGET / len(self.tenants))
                assert leased > share, "a lease refused within the tenant's share with none held"
            for key in keys[:found]:
                t.leases[key] = max(t.leases.get(key, 0.0), self.now + ms / 1000)

    @rule(ti=tenant_ix, keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
    def delete(self, ti: int, keys: list[bytes]) -> None:
        assert self.store is not None
        t = self.pick(ti)
        deleted = self.store.delete(NS, keys, tenant=t.name)
        assert deleted == sum(k in t.entries for k in keys)
        for key in keys:
            t.entries.pop(key, None)
            t.leases.pop(key, None)

    @rule(seconds=st.sampled_from([0.5, 3.0, 20.0]))
    def advance(self, seconds: float) -> None:
        self.clock.t += seconds

    @precondition(lambda self: self.store is not None)
    @rule()
    def maintain(self) -> None:
        assert self.store is not None
        self.store.apply_touches()
        due = sum(self.expired(e) for t in self.tenants.values() for e in t.entries.values())
        assert self.store.purge_expired() == due
        for t in self.tenants.values():
            for key in [k for k, e in t.entries.items() if self.expired(e)]:
                del t.entries[key]
                t.leases.pop(key, None)

    # -- invariants --------------------------------------------------------------------------------

    @invariant()
    def bytes_exact(self) -> None:
        if self.store is None:
            return
        usage = {u.tenant: u for u in self.store.tenant_usage()}
        for t in self.tenants.values():
            assert usage[t.name].used_bytes == t.used, (
                f"{t.name}: used {usage[t.name].used_bytes} != {t.used}"
            )
            assert usage[t.name].keys == len(t.entries)
            assert usage[t.name].protected_bytes == t.protected
            if t.quota:
                assert t.used <= t.quota
        stats = self.store.stats()
        assert stats.used_bytes == sum(t.used for t in self.tenants.values()) <= BUDGET


StoreModel.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreModel = StoreModel.TestCase


class AdaptiveStoreModel(StoreModel):
    """The same promises under ``adaptive``: its parts, admission and learned victim choice decide only
    which permitted entry goes."""

    policy = AdaptivePolicy


AdaptiveStoreModel.TestCase.settings = StoreModel.TestCase.settings
TestAdaptiveStoreModel = AdaptiveStoreModel.TestCase


@pytest.mark.parametrize("tenants", [1, 2])
def test_full_vault_keeps_storing(tmp_path: Path, tenants: int) -> None:
    """The audit's case, as an example: a full vault with a second tenant still evicts to store."""
    names = [f"t{i}" for i in range(tenants - 1)]
    with Store(tmp_path / "v", 64_000, sync_mode="fast", tenants=dict.fromkeys(names, 0)) as s:
        for i in range(80):
            outcome = s.put_many(b"ns", [(b"k%d" % i, b"x" * 1_000, 0)])
            assert outcome.stored == 1, f"put {i} rejected"
        stats = s.stats()
        assert stats.evictions > 0 and stats.used_bytes <= 64_000
