"""The LMDB store on its own: budget, accounting against a model, recency, corruption, persistence."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import OrderedDict
from pathlib import Path

import lmdb
import pytest

from tierkv.config import ContextWeights
from tierkv.vault.policy import PriorityLRUPolicy, make_policy
from tierkv.vault.store import Lookup, Store, full_key


def blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def live_entries(store: Store) -> dict[bytes, bytes]:
    """Every stored entry, read straight from LMDB (to compare with the model, never to build it)."""
    return store.debug.blobs()


def test_roundtrip_and_missing(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20) as s:
        s.put_many(b"ns", [(b"a", b"hello", 0), (b"b", b"", 0)])
        assert s.get_many(b"ns", [b"a", b"b", b"c"]) == [b"hello", b"", None]
        assert s.get_many(b"other", [b"a"]) == [None]


class LRUModel:
    """What an exact-LRU store of ``budget`` bytes must hold, fed the same operations as the store.

    It knows nothing of LMDB: reads mark keys as touched, and the next Put applies the touches (in
    touch order) before it writes, as the store documents; a write evicts least recently used entries
    until it fits, and an entry larger than the budget is rejected.
    """

    def __init__(self, budget: int, namespace: bytes) -> None:
        self.budget = budget
        self.namespace = namespace
        self.entries: OrderedDict[bytes, bytes] = OrderedDict()
        self.touched: OrderedDict[bytes, None] = OrderedDict()

    def charge(self, key: bytes, data: bytes) -> int:
        return len(self.namespace) + len(key) + len(data)

    @property
    def used(self) -> int:
        return sum(self.charge(k, v) for k, v in self.entries.items())

    def apply_touches(self) -> None:
        for key in self.touched:
            if key in self.entries:
                self.entries.move_to_end(key)
        self.touched.clear()

    def put(self, items: list[tuple[bytes, bytes]]) -> list[int]:
        self.apply_touches()
        rejected = []
        for i, (key, data) in enumerate(items):
            if self.charge(key, data) > self.budget:
                rejected.append(i)
                continue
            self.entries.pop(key, None)
            while self.used + self.charge(key, data) > self.budget:
                self.entries.popitem(last=False)
            self.entries[key] = data
        return rejected

    def get(self, keys: list[bytes]) -> list[bytes | None]:
        for key in keys:
            if key in self.entries:
                self.touched[key] = None
                self.touched.move_to_end(key)
        return [self.entries.get(k) for k in keys]

    def delete(self, keys: list[bytes]) -> int:
        return sum(self.entries.pop(k, None) is not None for k in keys)


def test_budget_holds_and_accounting_matches_a_model(tmp_path: Path) -> None:
    budget, ns = 200_000, b"ns"
    rng = random.Random(7)
    model = LRUModel(budget, ns)
    s = Store(tmp_path, budget, maintenance_interval_s=3600)
    try:
        for step in range(500):
            op = rng.random()
            keys = [f"k{rng.randrange(60)}".encode() for _ in range(rng.randrange(1, 4))]
            if op < 0.6:
                items = [(k, blob(rng.choice([0, 10, 5_000, 30_000, 70_000, 250_000]), step)) for k in keys]
                outcome = s.put_many(ns, [(k, d, 0) for k, d in items])
                assert outcome.rejected == model.put(items), f"step {step}"
            elif op < 0.75:
                assert s.delete(ns, keys) == model.delete(keys), f"step {step}"
            elif op < 0.97:
                assert s.get_many(ns, keys) == model.get(keys), f"step {step}"
            else:
                s.close()
                model.apply_touches()
                s = Store(tmp_path, budget, maintenance_interval_s=3600)
            stats = s.stats()
            assert stats.used_bytes == model.used <= budget, f"step {step}"
            assert stats.keys == len(model.entries), f"step {step}"
            expected = {full_key(ns, k): v for k, v in model.entries.items()}
            assert live_entries(s) == expected, f"step {step}: the stored entries are not the model's"
    finally:
        s.close()


def test_putting_ten_times_the_budget_keeps_the_newest(tmp_path: Path) -> None:
    budget = 1 << 20
    with Store(tmp_path, budget) as s:
        keys = [f"block-{i:04d}".encode() for i in range(160)]
        for i in range(0, 160, 8):
            s.put_many(b"ns", [(k, blob(64 * 1024, j), 0) for j, k in enumerate(keys[i : i + 8], start=i)])
            assert s.stats().used_bytes <= budget
        got = s.get_many(b"ns", keys[-14:])
        assert all(g is not None for g in got), "the most recent blocks must survive"
        assert s.get_many(b"ns", keys[:10]) == [None] * 10
        assert s.stats().evictions > 100


def test_reput_replaces_without_double_counting(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20) as s:
        s.put_many(b"ns", [(b"k", b"x" * 1000, 0)])
        s.put_many(b"ns", [(b"k", b"y" * 400, 0)])
        s.put_many(b"ns", [(b"k", b"y" * 400, 0)])
        assert s.stats().used_bytes == len(b"ns") + 1 + 400
        assert s.stats().keys == 1
        assert s.get_many(b"ns", [b"k"]) == [b"y" * 400]


def test_recency_protects_a_hot_key(tmp_path: Path) -> None:
    with Store(tmp_path, 100_000, maintenance_interval_s=60) as s:
        s.put_many(b"ns", [(b"hot", b"h" * 10_000, 0)])
        for i in range(30):
            s.put_many(b"ns", [(f"cold{i}".encode(), b"c" * 10_000, 0)])
            assert s.get_many(b"ns", [b"hot"]) == [b"h" * 10_000], f"hot key evicted at step {i}"
        assert s.stats().evictions >= 20


def test_without_reads_the_oldest_goes_first(tmp_path: Path) -> None:
    with Store(tmp_path, 50_000) as s:
        for i in range(10):
            s.put_many(b"ns", [(f"k{i}".encode(), b"v" * 9_000, 0)])
        present = [g is not None for g in s.get_many(b"ns", [f"k{i}".encode() for i in range(10)])]
        assert present == [False] * 5 + [True] * 5


def test_priority_policy_evicts_low_priority_first(tmp_path: Path) -> None:
    with Store(tmp_path, 50_000, policy=PriorityLRUPolicy()) as s:
        s.put_many(b"ns", [(b"system", b"s" * 9_000, 5)])
        for i in range(10):
            s.put_many(b"ns", [(f"tool{i}".encode(), b"t" * 9_000, 0)])
        assert s.get_many(b"ns", [b"system"]) == [b"s" * 9_000]


def test_blob_larger_than_budget_is_rejected(tmp_path: Path) -> None:
    with Store(tmp_path, 2 << 20) as s:
        s.put_many(b"ns", [(b"small", b"x", 0)])
        outcome = s.put_many(b"ns", [(b"huge", b"x" * (3 << 20), 0), (b"ok", b"y", 0)])
        assert outcome.rejected == [0] and outcome.stored == 1
        assert s.get_many(b"ns", [b"small", b"ok", b"huge"]) == [b"x", b"y", None]


def test_flipped_byte_is_corrupt_counted_and_dropped(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20) as s:
        s.put_many(b"ns", [(b"a", b"A" * 5000, 0), (b"b", b"B" * 5000, 0)])
        data = bytearray(s.debug.blobs()[full_key(b"ns", b"a")])
        data[1234] ^= 0x01
        s.debug.overwrite_blob(b"ns", b"a", bytes(data))
        with s.view_many(b"ns", [b"a", b"b"]) as views:
            assert [status for status, _ in views] == [Lookup.CORRUPT, Lookup.FOUND]
        assert s.stats().corrupt == 1
        assert s.stats().keys == 1
        assert s.get_many(b"ns", [b"a"]) == [None]
        assert s.stats().used_bytes == len(b"ns") + 1 + 5000


def test_blob_swapped_between_keys_is_corrupt(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20) as s:
        s.put_many(b"ns", [(b"a", b"A" * 100, 0), (b"b", b"B" * 100, 0)])
        s.debug.overwrite_blob(b"ns", b"a", b"B" * 100)
        assert s.get_many(b"ns", [b"a", b"b"]) == [None, b"B" * 100]


def test_state_survives_reopen(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20) as s:
        s.put_many(b"ns", [(b"a", b"1" * 100, 0), (b"b", b"2" * 200, 0)])
        used = s.stats().used_bytes
    with Store(tmp_path, 1 << 20) as s:
        assert s.get_many(b"ns", [b"a", b"b"]) == [b"1" * 100, b"2" * 200]
        assert s.stats().used_bytes == used and s.stats().keys == 2


def test_map_grows_instead_of_failing(tmp_path: Path) -> None:
    with Store(tmp_path, 32 << 20, map_size=4 << 20) as s:
        for i in range(12):
            s.put_many(b"ns", [(f"k{i}".encode(), os.urandom(1 << 20), 0)])
        assert s.stats().map_size > 4 << 20
        assert s.stats().keys == 12


def test_map_at_cap_is_a_clear_error(tmp_path: Path) -> None:
    from tierkv.vault.store import StoreFullError

    with Store(tmp_path, 64 << 20, map_size=2 << 20, max_map_size=2 << 20) as s:
        with pytest.raises(StoreFullError, match=r"cannot grow|cap"):
            s.put_many(b"ns", [(b"k", os.urandom(4 << 20), 0)])
        s.put_many(b"ns", [(b"small", b"ok", 0)])
        assert s.get_many(b"ns", [b"small"]) == [b"ok"]


def test_flush_namespace_and_everything(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20) as s:
        s.put_many(b"a", [(b"1", b"x", 0), (b"2", b"y", 0)])
        s.put_many(b"b", [(b"1", b"z", 0)])
        assert s.flush(b"a") == 2
        assert s.get_many(b"b", [b"1"]) == [b"z"]
        assert s.stats().keys == 1 and s.stats().used_bytes == len(b"b") + 1 + 1
        assert s.flush() == 1
        assert s.stats().used_bytes == 0


def test_policy_change_reranks_existing_entries(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20) as s:
        s.put_many(b"ns", [(b"a", b"x", 3)])
    with Store(tmp_path, 1 << 20, policy=PriorityLRUPolicy()) as s:
        ranks = s.debug.order_keys()
        assert len(ranks) == 1 and ranks[0][:2] == (3).to_bytes(2, "big")


def test_a_key_twice_in_one_put_shares_the_fate_of_its_last_blob(tmp_path: Path) -> None:
    """Under a leaf-first policy a Put is written last item first; a key given twice still ends with its
    last blob, and each of its positions is acknowledged as that blob fared."""
    with Store(tmp_path, 2 << 20, policy=make_policy("adaptive", ContextWeights())) as s:
        outcome = s.put_many(b"ns", [(b"x", b"small", 0), (b"y", b"y", 0), (b"x", b"x" * (3 << 20), 0)])
        assert (outcome.stored, outcome.rejected) == (1, [0, 2])
        assert s.get_many(b"ns", [b"x", b"y"]) == [None, b"y"]
        outcome = s.put_many(b"ns", [(b"x", b"old", 0), (b"x", b"new", 0)])
        assert (outcome.stored, outcome.rejected) == (2, [])
        assert s.get_many(b"ns", [b"x"]) == [b"new"] and s.stats().keys == 2


def test_a_reader_past_a_damaged_page_reads_on_while_a_resize_waits(tmp_path: Path) -> None:
    """LMDB refuses a transaction after a damaged page; the reader goes on in a fresh one while the spent
    one keeps its views pinned. Taking the shared lock a second time for it would wait behind a waiting
    map resize, which waits for the first: a deadlock."""
    with Store(tmp_path, 4 << 20) as s:
        s.put_many(b"ns", [(b"a", b"A" * 10_000, 0), (b"b", b"B" * 10_000, 0)])
    raw = bytearray((tmp_path / "data.mdb").read_bytes())
    at = raw.find(b"A" * 4000)
    raw[at - 16 : at] = b"\xee" * 16  # the header of the blob's overflow page
    (tmp_path / "data.mdb").write_bytes(raw)
    with Store(tmp_path, 4 << 20) as s:
        reader = s.reader()
        assert reader.get(b"ns", b"a") == (Lookup.CORRUPT, None)
        resized = threading.Event()

        def resize() -> None:
            with s.debug.resize_lock():
                resized.set()

        waiter = threading.Thread(target=resize, daemon=True)
        waiter.start()
        deadline = time.monotonic() + 10
        while not s.debug.resize_waiting() and time.monotonic() < deadline:
            time.sleep(0.001)  # the other thread reaching the lock (no timer of the store's)
        found: list[object] = []
        reading = threading.Thread(target=lambda: found.append(reader.get(b"ns", b"b")[0]), daemon=True)
        reading.start()
        reading.join(10)
        assert found == [Lookup.FOUND], "the reader is stuck behind the resize"
        assert not resized.is_set(), "the resize waits for the reader's transactions"
        reader.close()
        waiter.join(10)
        assert resized.is_set()
        assert s.get_many(b"ns", [b"a", b"b"]) == [None, b"B" * 10_000]


@pytest.mark.parametrize("record", [b"", b"12345"], ids=["empty", "short"])
def test_an_index_record_too_short_for_its_charge_is_dropped_with_the_blobs_charge(
    tmp_path: Path, record: bytes
) -> None:
    """A record that cannot say its charge was dropped as charging 0: the blob's bytes stayed in the
    totals for good, a budget shrunk by every such record."""
    with Store(tmp_path, 1 << 20) as s:
        s.put_many(b"ns", [(b"a", b"A" * 5000, 0), (b"b", b"B" * 5000, 0)])
    env = lmdb.open(str(tmp_path), max_dbs=4)
    index = env.open_db(b"index")
    with env.begin(write=True) as txn:
        txn.put(full_key(b"ns", b"a"), record, db=index)
    env.close()
    with Store(tmp_path, 1 << 20) as s:
        assert s.get_many(b"ns", [b"a", b"b"]) == [None, b"B" * 5000]
        assert s.stats().used_bytes == len(b"ns") + 1 + 5000
        assert s.stats().keys == 1
