"""A write transaction that aborts teaches ``adaptive``'s learner nothing.

The store tells a tenant's learner of every admission and eviction inside a Put's write transaction. When
that transaction aborts (a full map or disk; the store retries it, or the Put fails), none of it happened:
the learner must be exactly as it was at the last commit, its ghost lists in their order included.
Checked against an independent model (a deep copy taken at each commit, restored at each abort) by a
stateful test, and through a real LMDB map that fills up in the middle of a Put."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tierkv.vault.policy import AdaptivePolicy
from tierkv.vault.policy.learning import Part, Split, digest
from tierkv.vault.store import Store, StoreFullError

NS = b"ns"
FILL = b"fill"
BUDGET = 100
"""The stateful test's budget: ghost lists bounded at four budgets of 1-30-byte keys, so they trim."""


def _fkey(i: int) -> bytes:
    return b"\x02" + NS + hashlib.blake2b(str(i).encode(), digest_size=8).digest()


def _split_state(split: Split) -> tuple[float, int, list[tuple[int, int]], list[tuple[int, int]], int, int]:
    """What a split has learned, as a value: the target, the count, both ghost lists in order with sizes
    and their byte counts."""
    recent, frequent = split.recent, split.frequent
    return split.target, split.learned, recent.sizes(), frequent.sizes(), recent.bytes, frequent.bytes


class RollbackMachine(RuleBasedStateMachine):
    """The store's learner against a model: a plain split, copied whole at each commit."""

    def __init__(self) -> None:
        super().__init__()
        self.learner = AdaptivePolicy().state("t", BUDGET)
        self.model = Split(BUDGET)
        self.model_notes: list[tuple[int, int, bool]] = []
        self.committed = copy.deepcopy(self.model)
        self.pending = False

    def _model_take_notes(self) -> None:
        for key, size, proven in self.model_notes:
            self.model.remember(Part.MAIN if proven else Part.PROBATION, key, size)
        self.model_notes.clear()

    @rule(i=st.integers(0, 60), size=st.integers(1, 30), proven=st.booleans())
    def evict(self, i: int, size: int, proven: bool) -> None:
        self.learner.evicted((_fkey(i), size, proven))
        self.model_notes.append((digest(_fkey(i)), size, proven))
        self.pending = True

    @rule(i=st.integers(0, 60), size=st.integers(1, 30), importance=st.sampled_from([0.2, 0.5, 0.9]))
    def admit(self, i: int, size: int, importance: float) -> None:
        self._model_take_notes()
        expected = self.model.admit(digest(_fkey(i)), size, importance) is Part.MAIN
        assert self.learner.admit(_fkey(i), size, importance) is expected
        self.pending = True

    @rule()
    def commit(self) -> None:
        self.learner.settle()
        self._model_take_notes()
        self.committed = copy.deepcopy(self.model)
        self.pending = False

    @precondition(lambda self: self.pending)
    @rule()
    def abort(self) -> None:
        self.learner.abandon()
        self.model = copy.deepcopy(self.committed)
        self.model_notes.clear()
        self.pending = False

    @invariant()
    def learned_as_the_model(self) -> None:
        learner = copy.deepcopy(self.learner)  # its notes taken in on a copy: the machine goes on as it was
        learner.settle()
        model = copy.deepcopy(self.model)
        for key, size, proven in self.model_notes:
            model.remember(Part.MAIN if proven else Part.PROBATION, key, size)
        assert _split_state(learner.split) == _split_state(model)


TestRollback = RollbackMachine.TestCase
TestRollback.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


@pytest.fixture
def store_and_policy(tmp_path: Path) -> tuple[Store, AdaptivePolicy]:
    """A tenant of 40 blocks' quota in a vault whose map cannot grow past 2 MiB (the default tenant fills
    it later)."""
    policy = AdaptivePolicy()
    store = Store(
        tmp_path / "v",
        64 << 20,
        sync_mode="fast",
        policy=policy,
        tenants={"q": 40 * 1011},
        map_size=2 << 20,
        max_map_size=2 << 20,
        maintenance_interval_s=1e6,
    )
    return store, policy


def _blocks(name: str, n: int) -> list[tuple[bytes, bytes, int]]:
    keys = [hashlib.blake2b(f"{name}/{i}".encode(), digest_size=8).digest() for i in range(n)]
    return [(k, k * 125, 0) for k in keys]


def _fill_the_map(store: Store) -> None:
    """The default tenant fills the map with ever smaller blobs until 10 kB do not fit (a flush still
    does: its pages are copied on write too)."""
    for size in (100_000, 10_000):
        for i in range(1000):
            try:
                store.put_many(FILL, [(f"{size}/{i}".encode(), bytes(size), 0)])
            except StoreFullError:
                break


def test_a_put_that_aborts_midway_leaves_the_learner_as_it_was(
    store_and_policy: tuple[Store, AdaptivePolicy],
) -> None:
    store, policy = store_and_policy
    with store:
        first = _blocks("a", 40)
        for item in first:
            store.put_many(NS, [item], tenant="q")
        store.put_many(NS, _blocks("b", 5), tenant="q")  # evicts a0..a4: remembered
        split = policy.state("q", 40 * 1011).split
        before = _split_state(split)
        assert len(split.recent) == 5 and split.learned == 0
        _fill_the_map(store)
        # a remembered key (its ghost taken, the target moved: a batch is stored deepest block first, so
        # it goes last), then blocks that evict: the pages the evictions free are reusable only two
        # transactions later, so the map is full in the middle
        with pytest.raises(StoreFullError):
            store.put_many(NS, [*_blocks("flood", 3000), first[0]], tenant="q")
        assert _split_state(split) == before and digest(b"\x02" + NS + first[0][0]) in split.recent.keys
        store.flush(FILL)
        store.flush(FILL)  # the pages the first flush freed are reusable after one more transaction
        store.put_many(NS, [first[0]], tenant="q")  # still remembered: it starts in main
        got = store.entry(NS, first[0][0], tenant="q")
        assert got is not None and got.proven and split.learned == 1
