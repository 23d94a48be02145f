"""The in-process storage: its faults, leases and hints, and the pipeline over it (prefetch from its hints,
a corrupt blob recomputed and deleted, a slow storage a miss within the deadline). Time is a fake clock
and a recorded sleep: nothing here waits."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from tierkv.codec import LayerGroup
from tierkv.retention import BlockMeta
from tierkv.tiering import ColdTier, Faults, MemoryStorage, NumpyArrays, StreamSpec

NS = hashlib.sha256(b"memory").digest()
KV = StreamSpec(NS, LayerGroup.ATTENTION)
SHAPE = (2, 2, 4, 8)
TOKENS = 4


def key(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def time_() -> FakeTime:
    return FakeTime()


@pytest.fixture
def storage(time_: FakeTime) -> MemoryStorage:
    return MemoryStorage(timeout_s=0.5, clock=time_.clock, sleep=time_.sleep)


def chain(storage: MemoryStorage, names: list[str], parent: str = "", tokens: int = 0) -> list[bytes]:
    ks = [key(n) for n in names]
    parents = [key(parent) if parent else b"", *ks[:-1]]
    meta = {
        k: BlockMeta(parent=p, tokens=tuple(range(i * tokens, (i + 1) * tokens)))
        for i, (k, p) in enumerate(zip(ks, parents, strict=True))
    }
    assert storage.put(NS, {k: k * 2 for k in ks}, meta=meta).stored == len(ks)
    return ks


def test_down_stores_nothing_and_every_read_misses(storage: MemoryStorage) -> None:
    ks = chain(storage, ["a", "b"])
    storage.faults.down = True
    assert storage.put(NS, {key("c"): b"c"}).stored == 0
    assert storage.get_buffers(NS, ks) == [None, None]
    assert storage.prefix_lookup(NS, ks) == 0
    assert storage.successors(NS, ks[:1]) == [] and storage.hottest(NS) == []
    assert storage.delete(NS, ks) == 0
    storage.faults.down = False
    assert storage.get_buffers(NS, ks) == [k * 2 for k in ks], "nothing was lost while it was down"


def test_slow_past_the_deadline_is_a_miss_after_the_deadline(storage: MemoryStorage, time_: FakeTime) -> None:
    ks = chain(storage, ["a"])
    storage.faults.delay_s = 0.3
    assert storage.get_buffers(NS, ks) == [ks[0] * 2], "slower than usual but within the deadline"
    assert storage.get_buffers(NS, ks, timeout=0.1) == [None]
    storage.faults.delay_s = 30.0
    assert storage.prefix_lookup(NS, ks) == 0
    assert time_.slept == [0.3, 0.1, 0.5], "a call waits at most its deadline"


def test_capacity_evicts_the_oldest_unleased_and_a_read_ends_a_lease(
    storage: MemoryStorage, time_: FakeTime
) -> None:
    storage.faults.capacity = 2
    a, b = chain(storage, ["a", "b"])
    assert storage.prefix_lookup(NS, [a], lease_ms=1000) == 1
    (c,) = chain(storage, ["c"])
    assert storage.get_buffers(NS, [a, b, c]) == [a * 2, None, c * 2], "the leased oldest stayed"
    (d,) = chain(storage, ["d"])  # the read ended a's lease
    assert storage.get_buffers(NS, [a, c, d]) == [None, c * 2, d * 2]
    assert storage.prefix_lookup(NS, [c], lease_ms=1000) == 1
    time_.now += 1.5
    chain(storage, ["e"])
    assert storage.prefix_lookup(NS, [c]) == 0, "an expired lease keeps nothing"
    assert [k for _, k in storage.evicted] == [b, a, c]


def test_successors_follow_the_most_read_child_and_hottest_walks_to_the_root(storage: MemoryStorage) -> None:
    root = chain(storage, ["sys-0", "sys-1"], tokens=2)
    cold = chain(storage, ["x-0", "x-1"], parent="sys-1", tokens=2)
    hot = chain(storage, ["y-0", "y-1", "y-2"], parent="sys-1", tokens=2)
    assert [s.key for s in storage.successors(NS, root)] == cold, "no reads yet: the first stored"
    storage.get_buffers(NS, hot[-1:] + hot[:1])
    found = storage.successors(NS, root)
    assert [s.key for s in found] == hot and found[0].size == len(hot[0]) * 2
    assert [s.key for s in storage.successors(NS, root, max_keys=2)] == hot[:2]
    assert storage.successors(NS, root, max_bytes=len(hot[0]) * 2) == found[:1]
    chains = storage.hottest(NS)
    assert [c.keys for c in chains] == [tuple(root + hot), tuple(root + cold)]
    assert chains[0].hits == 1.0 and chains[0].tokens == (0, 1, 2, 3, 0, 1, 2, 3, 4, 5)
    storage.delete(NS, root[:1])
    assert storage.hottest(NS, limit=1)[0].tokens == (), "a chain cut from its root cannot be replayed"


def arrays(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(n)]


def store(tier: ColdTier[np.ndarray], names: list[str], parent: str = "") -> list[bytes]:
    ks = [key(n) for n in names]
    parents = [key(parent) if parent else b"", *ks[:-1]]
    meta = {k: BlockMeta(parent=p) for k, p in zip(ks, parents, strict=True)}
    tally = tier.store(KV, ((k, a, TOKENS) for k, a in zip(ks, arrays(len(ks)), strict=True)), meta)
    assert tally.stored == len(ks)
    return ks


def restore(tier: ColdTier[np.ndarray], ks: list[bytes]) -> tuple[list[int], list[np.ndarray]]:
    out = [np.full(SHAPE, np.nan, np.float32) for _ in ks]
    got = tier.restore(KV, ks, KV.expect(SHAPE, TOKENS), out.__getitem__)
    return got.decoded, out


def test_prefetch_takes_the_storages_hints() -> None:
    storage = MemoryStorage()
    tier = ColdTier(storage, NumpyArrays(), prefetch_bytes=1 << 20)
    assert tier.prefetch is not None
    first = store(tier, ["sys-0", "sys-1"])
    turn = store(tier, ["turn-0", "turn-1"], parent="sys-1")
    restore(tier, first)
    assert tier.prefetch.drain(10.0) and tier.prefetch.stats.fetched == 2
    gets = storage.calls["get"]
    decoded, out = restore(tier, turn)
    assert decoded == [0, 1] and storage.calls["get"] == gets, "both blocks came from the buffer"
    assert all(np.array_equal(x, y) for x, y in zip(out, arrays(2), strict=True))
    tier.close()


def test_a_corrupt_blob_is_a_miss_and_is_deleted() -> None:
    storage = MemoryStorage(faults=Faults(corrupt=True))
    tier = ColdTier(storage, NumpyArrays())
    ks = store(tier, ["a", "b"])
    decoded, out = restore(tier, ks)
    assert decoded == [] and all(np.isnan(o).all() for o in out)
    assert storage.blobs[("kv_cold", NS)] == {}, "the rejected blobs were deleted"
