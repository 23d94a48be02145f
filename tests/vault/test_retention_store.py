"""Retention in the LMDB store: protection within its cap, time to live, the context policy's order and
exact budget against an independent model, and per-class feedback."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierkv.config import ContextWeights
from tierkv.retention import BlockMeta
from tierkv.vault.policy import ContextPolicy, EntryInfo, context_score
from tierkv.vault.store import Store, full_key

W = ContextWeights()
PROTECTED = BlockMeta("axioms", 1.0, protected=True)
FILLER = BlockMeta("generation", 0.1)


def keys_of(store: Store, tenant: str = "default") -> set[bytes]:
    return store.debug.index_keys(tenant)


def put(
    store: Store, ns: bytes, items: dict[bytes, bytes], meta: BlockMeta | None = None, **kw: object
) -> None:
    rows = [(k, v, 0) for k, v in items.items()]
    store.put_many(ns, rows, metas=[meta] * len(rows) if meta else None, **kw)  # type: ignore[arg-type]


# -- the score -------------------------------------------------------------------------------------------

BASE = {"importance": 0.5, "hits": 1.0, "sharing": 1, "size": 16384, "age": 1.0}


@pytest.mark.parametrize(
    ("field", "better"),
    [("importance", 0.9), ("hits", 8.0), ("sharing", 5), ("age", 0.2), ("size", 1024)],
)
def test_each_term_moves_the_score_the_documented_way(field: str, better: float) -> None:
    assert context_score(W, **{**BASE, field: better}) > context_score(W, **BASE)  # type: ignore[arg-type]


def test_score_is_the_documented_formula() -> None:
    w = ContextWeights(importance=3, hits=2, sharing=1.5, size=0.5, age=0.25)
    got = context_score(w, importance=0.8, hits=3.0, sharing=7, size=4096, age=2.0)
    assert got == pytest.approx(3 * 0.8 + 2 * 2 + 1.5 * 3 - 0.5 * 2 - 0.25 * 2)


entries = st.builds(
    EntryInfo,
    clock=st.integers(0, 10**6),
    size=st.integers(1, 1 << 24),
    importance=st.floats(0, 1),
    hits=st.floats(0, 1000),
    sharing=st.integers(0, 1000),
    population=st.just(5000),
)


@given(st.lists(entries, min_size=2, max_size=20), st.integers(10**6, 10**7))
def test_rank_orders_as_the_score_at_any_later_clock(infos: list[EntryInfo], now: int) -> None:
    policy = ContextPolicy(W)

    def score(e: EntryInfo) -> float:
        age = (now - e.clock) / e.population
        return context_score(W, importance=e.importance, hits=e.hits, sharing=e.sharing, size=e.size, age=age)

    by_rank = sorted(infos, key=policy.rank)
    scores = [score(e) for e in by_rank]
    assert all(a <= b + 1e-6 * max(1.0, abs(b)) for a, b in itertools.pairwise(scores))


def test_hits_halve_every_half_life() -> None:
    policy = ContextPolicy(ContextWeights(hit_half_life=2.0))
    assert policy.decayed_hits(8.0, elapsed=2 * 100, population=100) == pytest.approx(4.0)


def test_min_turnover_keeps_importance_worth_as_many_events_in_a_small_vault() -> None:
    """In a vault of 10 entries an importance-1 block stored at clock 0 outlives an importance-0 one
    stored at clock 3999 only when a turnover lasts at least 1000 events (credit 4 x 1000 events)."""
    important = EntryInfo(clock=0, size=4096, importance=1.0, population=10)
    later = EntryInfo(clock=3999, size=4096, importance=0.0, population=10)
    floored = ContextPolicy(ContextWeights(min_turnover=1000))
    assert floored.turnover(10) == 1000 and floored.turnover(5000) == 5000
    assert min([important, later], key=floored.rank) is later
    assert min([important, later], key=ContextPolicy(W).rank) is important
    assert floored.decayed_hits(8.0, elapsed=1000, population=10) == pytest.approx(4.0)


# -- the store under the context policy ------------------------------------------------------------------


def test_importance_hits_sharing_and_age_each_keep_an_entry(tmp_path: Path) -> None:
    """Five equal entries of which four have one advantage each: the plain one goes first."""
    blob = b"b" * 10_000
    with Store(tmp_path, 60_000, policy=ContextPolicy(W), maintenance_interval_s=3600) as s:
        s.put_many(b"ns", [(b"plain", blob, 0)], metas=[BlockMeta("context", 0.5)])
        s.put_many(b"ns", [(b"important", blob, 0)], metas=[BlockMeta("rules", 1.0)])
        s.put_many(b"ns", [(b"hit", blob, 0)], metas=[BlockMeta("context", 0.5)])
        s.put_many(b"ns", [(b"shared", blob, 0)], metas=[BlockMeta("context", 0.5)])
        children = [(b"child%d" % i, b"c", 0) for i in range(4)]
        s.put_many(b"ns", children, metas=[BlockMeta("context", 0.5, parent=b"shared")] * 4)
        for _ in range(4):
            s.get_many(b"ns", [b"hit"])
        s.put_many(b"ns", [(b"recent", blob, 0)], metas=[BlockMeta("context", 0.5)])
        s.delete(b"ns", [k for k, _, _ in children])  # children gone: 'shared' keeps no credit...
        s.put_many(b"ns", children, metas=[BlockMeta("context", 0.5, parent=b"shared")] * 4)  # ...until back
        s.put_many(b"ns", [(b"newcomer", blob, 0)], metas=[BlockMeta("context", 0.5)])
        live = {k[3:] for k in keys_of(s)}
        assert b"plain" not in live
        assert {b"important", b"hit", b"shared", b"recent", b"newcomer"} <= live


def test_sharing_counts_stored_children(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20, policy=ContextPolicy(W)) as s:
        s.put_many(b"ns", [(b"root", b"r", 0)], metas=[BlockMeta("axioms")])
        kids = [(b"k%d" % i, b"k", 0) for i in range(3)]
        s.put_many(b"ns", kids, metas=[BlockMeta("context", parent=b"root")] * 3)
        s.put_many(b"ns", kids[:1], metas=[BlockMeta("context", parent=b"root")])  # a re-store is one child
        assert s.entry(b"ns", b"root").sharing == 3
        s.delete(b"ns", [b"k0", b"k1"])
        assert s.entry(b"ns", b"root").sharing == 1


class ContextModel:
    """The context policy by exhaustive search: every eviction scans every entry for the lowest rank.

    It shares only the documented rank with the store (``ContextPolicy.rank`` of the entry's clock,
    size, importance, hits, children and the store population at its last update), not one line of
    bookkeeping: charges, overwrites, sharing, touches and evictions are its own.
    """

    def __init__(self, budget: int, ns: bytes) -> None:
        self.budget, self.ns = budget, ns
        self.policy = ContextPolicy(W)
        self.entries: dict[bytes, dict[str, float]] = {}
        self.clock = 0
        self.touched: dict[bytes, int] = {}

    def _rank(self, e: dict[str, float]) -> bytes:
        return self.policy.rank(
            EntryInfo(
                clock=int(e["clock"]),
                size=int(e["charge"]),
                importance=e["importance"],
                hits=e["hits"],
                sharing=int(e["sharing"]),
                population=int(e["pop"]),
            )
        )

    def _children(self, key: bytes, delta: int) -> None:
        parent = self.entries.get(key)
        if parent is not None:
            parent["sharing"] = max(0, parent["sharing"] + delta)
            parent["pop"] = max(1, len(self.entries))

    def _remove(self, key: bytes) -> None:
        e = self.entries.pop(key)
        if e["parent"]:
            self._children(e["parent"], -1)  # type: ignore[arg-type]

    def put(self, items: list[tuple[bytes, bytes, BlockMeta]]) -> None:
        for key, hits in self.touched.items():
            if key in self.entries:
                e = self.entries[key]
                self.clock += 1
                e["hits"] = (
                    self.policy.decayed_hits(e["hits"], self.clock - int(e["clock"]), int(e["pop"])) + hits
                )
                e["clock"], e["pop"] = self.clock, max(1, len(self.entries))
        self.touched.clear()
        for key, data, meta in items:
            charge = len(self.ns) + len(key) + len(data)
            old = self.entries.get(key)
            if old is not None:
                self._remove(key)
            while sum(e["charge"] for e in self.entries.values()) + charge > self.budget:
                self._remove(min(self.entries, key=lambda k: self._rank(self.entries[k])))
            self.clock += 1
            self.entries[key] = {
                "charge": charge,
                "clock": self.clock,
                "importance": meta.importance,
                "hits": old["hits"] if old else 0.0,
                "sharing": old["sharing"] if old else 0,
                "pop": max(1, len(self.entries)),
                "parent": meta.parent,  # type: ignore[dict-item]
            }
            if meta.parent:
                self._children(meta.parent, 1)

    def get(self, keys: list[bytes]) -> None:
        for k in keys:
            if k in self.entries:
                self.touched[k] = self.touched.pop(k, 0) + 1


def test_budget_and_contents_match_an_independent_model(tmp_path: Path) -> None:
    rng = random.Random(11)
    budget = 400_000
    model = ContextModel(budget, b"ns")
    with Store(tmp_path, budget, policy=ContextPolicy(W), maintenance_interval_s=3600) as s:
        for step in range(250):
            if rng.random() < 0.3 and model.entries:
                keys = rng.sample(sorted(model.entries), min(3, len(model.entries)))
                s.get_many(b"ns", keys)
                model.get(keys)
                continue
            items = []
            for _ in range(rng.randint(1, 4)):
                key = b"k%d" % rng.randint(0, 80)
                parent = b"k%d" % rng.randint(0, 80) if rng.random() < 0.5 else b""
                meta = BlockMeta(rng.choice(["tools", "generation"]), rng.random(), parent=parent)
                items.append((key, rng.randbytes(rng.randint(1000, 60_000)), meta))
            s.put_many(b"ns", [(k, d, 0) for k, d, _ in items], metas=[m for _, _, m in items])
            model.put(items)
            stored = keys_of(s)
            assert stored == {full_key(b"ns", k) for k in model.entries}, f"step {step}"
            used = s.stats().used_bytes
            assert used == sum(e["charge"] for e in model.entries.values()) <= budget


# -- protection ------------------------------------------------------------------------------------------


def test_protected_entries_survive_tenfold_overfill(tmp_path: Path) -> None:
    budget = 1 << 20
    with Store(tmp_path, budget, policy=ContextPolicy(W)) as s:
        pinned = {b"sys%d" % i: b"p" * 10_000 for i in range(20)}  # ~200 KB, under half the budget
        put(s, b"ns", pinned, PROTECTED)
        for i in range(10 * budget // 20_000):
            put(s, b"ns", {b"gen%d" % i: b"g" * 20_000}, FILLER)
        assert s.get_many(b"ns", list(pinned)) == list(pinned.values())
        assert s.stats().used_bytes <= budget and s.stats().protected_overflow == 0


def test_protected_cap_holds_and_overflow_is_stored_unprotected(tmp_path: Path) -> None:
    budget = 1 << 20
    with Store(tmp_path, budget, max_protected_fraction=0.25) as s:
        for i in range(40):  # 400 KB asked to be protected, 256 KiB may be
            put(s, b"ns", {b"sys%d" % i: b"p" * 10_000}, PROTECTED)
        st_ = s.stats()
        assert st_.protected_bytes <= budget // 4 < st_.protected_bytes + 10_005
        assert st_.protected_overflow == 40 - st_.protected_bytes // 10_005
        for i in range(200):
            put(s, b"ns", {b"gen%d" % i: b"g" * 20_000})
        alive = [
            k
            for k, v in zip(range(40), s.get_many(b"ns", [b"sys%d" % i for i in range(40)]), strict=True)
            if v
        ]
        assert alive == list(range(st_.protected_bytes // 10_005))  # the protected ones, and only those


def test_a_tenants_protected_bytes_are_capped_by_its_quota(tmp_path: Path) -> None:
    with Store(tmp_path, 4 << 20, tenants={"a": 200_000}, max_protected_fraction=0.5) as s:
        for i in range(20):
            put(s, b"ns", {b"sys%d" % i: b"p" * 10_000}, PROTECTED, tenant="a")
        # half the quota is 100,000 bytes: sys0..sys8 (10,006 each) fit, sys9 would pass it
        assert (s.stats("a").protected_bytes, s.stats("a").protected_overflow) == (9 * 10_006, 11)


# -- time to live ----------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def test_expired_entries_read_as_misses_and_go_first(tmp_path: Path) -> None:
    clock = FakeClock()
    with Store(tmp_path, 100_000, maintenance_interval_s=3600, clock=clock) as s:
        put(s, b"ns", {b"short": b"s" * 30_000}, BlockMeta("generation", 0.1, ttl_s=0.3))
        put(s, b"ns", {b"old": b"o" * 30_000})
        put(s, b"ns", {b"long": b"l" * 30_000}, BlockMeta("tools", 0.7, ttl_s=3600))
        assert s.prefix_lookup(b"ns", [b"short"]) == 1
        clock.t += 0.299
        assert s.prefix_lookup(b"ns", [b"short"]) == 1, "not yet"
        clock.t += 0.002
        assert s.get_many(b"ns", [b"short", b"long"]) == [None, b"l" * 30_000]
        assert s.prefix_lookup(b"ns", [b"short"]) == 0
        assert s.stats().expired == 1
        put(s, b"ns", {b"new": b"n" * 30_000})  # needs room: the expired entry goes, not the LRU one
        assert keys_of(s) == {full_key(b"ns", k) for k in (b"old", b"long", b"new")}
        by_class = {c.source: c for c in s.class_usage()}
        assert (by_class["generation"].expired, by_class["generation"].misses) == (1, 1)


def test_maintenance_clears_expired_entries(tmp_path: Path) -> None:
    clock = FakeClock()
    with Store(tmp_path, 1 << 20, maintenance_interval_s=3600, clock=clock) as s:
        put(s, b"ns", {b"a": b"x", b"b": b"y"}, BlockMeta("generation", ttl_s=0.1))
        put(s, b"ns", {b"c": b"z"})
        assert s.purge_expired() == 0
        clock.t += 0.2
        assert s.purge_expired() == 2
        assert keys_of(s) == {full_key(b"ns", b"c")}
        assert s.stats().keys == 1


# -- feedback --------------------------------------------------------------------------------------------


def test_hits_misses_and_bytes_per_class(tmp_path: Path) -> None:
    with Store(tmp_path, 100_000, maintenance_interval_s=3600) as s:
        put(s, b"ns", {b"t1": b"t" * 1000, b"t2": b"t" * 1000}, BlockMeta("tools", 0.7))
        put(s, b"ns", {b"u": b"u" * 500})
        s.get_many(b"ns", [b"t1", b"t2", b"u", b"nope"])
        for i in range(10):  # push the tools out of the budget
            put(s, b"ns", {b"g%d" % i: b"g" * 20_000}, FILLER)
        s.get_many(b"ns", [b"t1"])
        c = {u.source: u for u in s.class_usage()}
        assert (c["tools"].hits, c["tools"].misses, c["tools"].keys, c["tools"].bytes) == (2, 1, 0, 0)
        assert (c["tools"].hits_5m, c["tools"].lookups_5m) == (2, 3)
        assert (c[""].hits, c[""].misses) == (1, 1)
        assert c["generation"].bytes == s.stats().used_bytes - c[""].bytes


def test_class_figures_survive_a_restart(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20) as s:
        put(s, b"ns", {b"a": b"x" * 100}, PROTECTED)
        put(s, b"ns", {b"b": b"y" * 100}, BlockMeta("tools"))
    with Store(tmp_path, 1 << 20) as s:
        c = {u.source: u for u in s.class_usage()}
        assert (c["axioms"].bytes, c["axioms"].protected_bytes, c["tools"].keys) == (103, 103, 1)
        assert s.stats().protected_bytes == 103


def test_untagged_entries_keep_the_old_index_format_under_lru(tmp_path: Path) -> None:
    with Store(tmp_path, 1 << 20) as s:
        put(s, b"ns", {b"a": b"x" * 100})
        s.get_many(b"ns", [b"a"])
        s.apply_touches()
        record = s.debug.index_record(b"ns", b"a")
        assert record is not None and len(record) == 26
