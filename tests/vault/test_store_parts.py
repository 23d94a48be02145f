"""The store's parts on their own: the data format's version, and the evictor on a write transaction it is
given (a ledger with a clock reading of the test's choosing, a real lease table on a fake clock)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import lmdb
import pytest

from tierkv.retention.classes import BlockMeta
from tierkv.vault.leases import LeaseTable
from tierkv.vault.policy import LRUPolicy
from tierkv.vault.store import FORMAT_VERSION, Store, StoreFormatError
from tierkv.vault.store.entries import Entries, EntryWriter
from tierkv.vault.store.env import StoreEnv
from tierkv.vault.store.evictor import Evictor, Ranking
from tierkv.vault.store.format import FORMAT_KEY, META, full_key, get_u64, put_u64
from tierkv.vault.store.ledger import Ledger
from tierkv.vault.store.tenants import Tenants

BUDGET = 1000


def test_a_store_gets_its_format_version_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20) as s:
        s.put_many(b"ns", [(b"a", b"x", 0)])
    env = lmdb.open(str(tmp_path), max_dbs=4, subdir=True)
    with env.begin(write=True) as txn:
        meta = env.open_db(META, txn=txn)
        assert get_u64(txn, meta, FORMAT_KEY, str(tmp_path)) == FORMAT_VERSION
        put_u64(txn, meta, FORMAT_KEY, FORMAT_VERSION + 1)
    env.close()
    with pytest.raises(StoreFormatError, match=f"data format {FORMAT_VERSION + 1} is newer"):
        Store(tmp_path, 1 << 20)
    env = lmdb.open(str(tmp_path), max_dbs=4, subdir=True)
    with env.begin(write=True) as txn:
        txn.delete(FORMAT_KEY, db=env.open_db(META, txn=txn))
    env.close()
    with Store(tmp_path, 1 << 20) as s:  # a store from before versions is version 1
        assert s.get_many(b"ns", [b"a"]) == [b"x"]


class Parts:
    """An evictor over a real LMDB environment, with every part it needs and a fake clock."""

    def __init__(self, path: Path, quotas: dict[str, int]) -> None:
        self.now = 1000.0
        self.env = StoreEnv(path, BUDGET, durable=False, map_size=None, max_map_size=None, on_damage="refuse")
        self.tenants = Tenants(self.env, quotas)
        self.leases = LeaseTable(BUDGET, clock=lambda: self.now, tenants=len(self.tenants))
        self.entries = Entries(Ranking(LRUPolicy()))
        self.evictor = Evictor(self.entries.ranking, self.entries, self.leases, self.tenants.all, BUDGET)
        self.writer = EntryWriter(self.entries, self.evictor, BUDGET, 0.5)
        self.clock = 0

    def put(self, tenant: str, key: bytes, size: int, meta: BlockMeta | None = None) -> bool:
        return self.put_together(tenant, [(key, size, meta)])[0]

    def put_together(
        self,
        tenant: str,
        items: list[tuple[bytes, int, BlockMeta | None]],
        between: Callable[[], None] = lambda: None,
    ) -> list[bool]:
        """Entries written in one write transaction, as one Put batch is; ``between`` runs after each (what
        other threads do meanwhile)."""
        owner = self.tenants[tenant]
        ledger = Ledger(self.tenants, self.clock, self.now)
        done = []
        with self.env.env.begin(write=True) as txn:
            for key, size, meta in items:
                item = (full_key(b"n", key), b"x" * size, 0, meta)
                done.append(self.writer.put_one(txn, ledger, owner, item))
                between()
        self.clock = ledger.clock
        ledger.take_into(self.tenants, threading.Lock())
        return done

    def keys(self, tenant: str) -> set[bytes]:
        with self.env.env.begin() as txn:
            return {bytes(k)[2:] for k in txn.cursor(db=self.tenants[tenant].index).iternext(values=False)}


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    p = Parts(tmp_path, {"q": 400, "free": 0})
    yield p
    p.env.close()


def test_the_evictor_takes_the_writers_oldest_and_keeps_a_leased_one(tmp_path: Path) -> None:
    parts = Parts(tmp_path, {})  # one tenant: its lease share is a quarter of the budget
    for k in (b"a", b"b", b"c", b"d"):
        assert parts.put("default", k, 200)
    fkey_a = full_key(b"n", b"a")
    parts.leases.grant("default", [(fkey_a, 203)], 60_000, since=parts.leases.mark(), quota=0)
    assert parts.put("default", b"e", 200)
    assert parts.keys("default") == {b"a", b"c", b"d", b"e"}, "b went: a is leased"
    parts.now += 61  # the lease ended
    assert parts.put("default", b"f", 200)
    assert parts.keys("default") == {b"c", b"d", b"e", b"f"}
    parts.env.close()


def test_a_walk_past_leased_entries_resumes_within_its_transaction_after_their_lease_ended(
    tmp_path: Path,
) -> None:
    parts = Parts(tmp_path, {})
    for k in (b"a", b"b", b"c", b"d"):
        assert parts.put("default", k, 200)
    fkey_a = full_key(b"n", b"a")
    parts.leases.grant("default", [(fkey_a, 203)], 60_000, since=parts.leases.mark(), quota=0)
    # e's room: the walk passes leased a and takes b; a's reader then finishes (the last lease ends)
    done = parts.put_together(
        "default", [(b"e", 200, None), (b"f", 200, None)], lambda: parts.leases.release("default", [fkey_a])
    )
    assert done == [True, True]
    assert parts.keys("default") == {b"a", b"d", b"e", b"f"}, "f's room: c, where the walk stopped, not a"
    assert parts.put("default", b"g", 200)
    assert parts.keys("default") == {b"d", b"e", b"f", b"g"}, "the next transaction takes a"
    parts.env.close()


def test_the_evictor_never_takes_from_a_tenant_with_a_quota_for_another(parts: Parts) -> None:
    assert parts.put("q", b"q1", 350)
    for k in (b"a", b"b", b"c"):
        assert parts.put("default", k, 200)
    assert parts.put("free", b"f1", 150)
    assert parts.keys("q") == {b"q1"}, "the quota'd tenant's entry stays"
    assert parts.keys("default") == {b"b", b"c"} and parts.keys("free") == {b"f1"}
    assert not parts.put("q", b"q2", 500), "over its own quota: rejected, nothing evicted for it"


def test_an_expired_entry_goes_first_whatever_its_rank(parts: Parts) -> None:
    assert parts.put("default", b"old", 200)
    assert parts.put("default", b"ttl", 200, BlockMeta(ttl_s=10))
    for k in (b"x", b"y"):
        assert parts.put("default", k, 200)
    parts.now += 11
    assert parts.put("default", b"z", 200)
    assert parts.keys("default") == {b"old", b"x", b"y", b"z"}, "the newer but expired entry went"


def test_maintenance_failing_on_a_damaged_page_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    """A damaged page fails every maintenance pass alike; a traceback a second filled the log."""
    from tierkv.vault.store.maintenance import Maintainer

    passes = threading.Semaphore(0)

    def damaged() -> None:
        passes.release()
        raise lmdb.CorruptedError("mdb_get: MDB_CORRUPTED: Located page was wrong type")

    caplog.set_level(logging.INFO, logger="tierkv.vault.store")
    maintainer = Maintainer([damaged], interval=0.001)
    try:
        for _ in range(20):  # twenty passes, counted as they happen (no sleep on the interval)
            assert passes.acquire(timeout=10)
    finally:
        maintainer.stop()
    failed = [r for r in caplog.records if "store maintenance failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is None and "MDB_CORRUPTED" in failed[0].getMessage()
