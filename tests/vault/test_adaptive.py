"""The ``adaptive`` policy in the real store (LMDB): probation and main, leaf-first stamps, admission by
ghost lists, protection kept, the parts surviving a reopen; and its learning state alone."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from tierkv.config import Config, VaultConfig
from tierkv.retention.classes import BlockMeta
from tierkv.vault.policy import DEFAULT_POLICY, AdaptivePolicy, LRUPolicy, make_policy
from tierkv.vault.policy.learning import (
    GHOST_BUDGETS,
    INITIAL_TARGET,
    MAX_GHOSTS,
    MAX_SHADOW_KEYS,
    AdaptiveState,
    Part,
    Split,
    digest,
    sampled,
)
from tierkv.vault.store import Store

NS = b"ns"
BLOB = 1000
BUDGET = 40 * 1011  # 40 entries of 1,010 bytes (namespace + key + blob)


def _key(name: str, i: int) -> bytes:
    return hashlib.blake2b(f"{name}/{i}".encode(), digest_size=8).digest()


def _put(store: Store, keys: list[bytes], metas: list[BlockMeta | None] | None = None) -> None:
    outcome = store.put_many(NS, [(k, k * (BLOB // 8), 0) for k in keys], metas=metas)
    assert not outcome.rejected


def _open(path: Path, policy: str) -> Store:
    return Store(path, BUDGET, sync_mode="fast", policy=make_policy(policy), maintenance_interval_s=1e6)


def test_adaptive_is_the_vaults_default_policy() -> None:
    assert VaultConfig().policy == DEFAULT_POLICY == "adaptive" == Config().vault.policy


@pytest.mark.parametrize(("policy", "kept"), [("adaptive", True), ("lru", False)])
def test_blocks_read_outlive_a_flood_of_blocks_never_read(tmp_path: Path, policy: str, kept: bool) -> None:
    """Read blocks are in main; probation (at most half the budget at first) gives up its victims while
    over its target, so one-off blocks never push them out; under LRU they do."""
    with _open(tmp_path / "v", policy) as store:
        hot = [_key("hot", i) for i in range(10)]
        _put(store, hot)
        assert store.prefix_lookup(NS, hot) == 10 and all(store.get_many(NS, hot))
        for i in range(200):
            _put(store, [_key("once", i)])
        assert store.stats().evictions > 100
        assert store.prefix_lookup(NS, hot) == (10 if kept else 0)


def test_a_chain_is_trimmed_from_its_deepest_block(tmp_path: Path) -> None:
    """Leaf first: the blocks of one put are stamped deepest first, so eviction takes the chain's end and
    the prefix stays usable (LRU takes the root first and the whole chain is lost to lookups)."""
    chain = [_key("c", i) for i in range(40)]
    for policy, hits in (("adaptive", 39), ("lru", 0)):
        with _open(tmp_path / policy, policy) as store:
            _put(store, chain)
            _put(store, [_key("new", 0)])
            assert store.stats().evictions == 1
            assert store.prefix_lookup(NS, chain) == hits


def test_a_key_stored_again_soon_after_its_eviction_goes_to_main(tmp_path: Path) -> None:
    policy = AdaptivePolicy()
    with Store(tmp_path / "v", BUDGET, sync_mode="fast", policy=policy, maintenance_interval_s=1e6) as store:
        first = [_key("a", i) for i in range(40)]
        for k in first:
            _put(store, [k])
        _put(store, [_key("b", i) for i in range(5)])  # evicts a0..a4 from probation: remembered
        state = next(iter(policy._states.values()))
        assert len(state.split.recent) == 5 and state.split.learned == 0
        _put(store, [first[0]])  # back while remembered: proven, and the target learns
        assert state.split.learned == 1 and state.split.target > INITIAL_TARGET * BUDGET
        got = store.entry(NS, first[0])
        assert got is not None and got.proven


def test_each_tenant_learns_from_its_own_evictions(tmp_path: Path) -> None:
    """Each tenant has its own learning state, over its own bytes (its quota, else the vault's budget): a
    key evicted from one tenant is remembered there only, so stored again in another tenant it starts in
    probation, and stored again in its own, in main."""
    policy = AdaptivePolicy()
    with Store(
        tmp_path / "v",
        2 * BUDGET,
        sync_mode="fast",
        policy=policy,
        tenants={"q": BUDGET},
        maintenance_interval_s=1e6,
    ) as store:
        first = [_key("a", i) for i in range(40)]
        for k in [*first, *(_key("b", i) for i in range(5))]:  # q's quota holds 40: a0..a4 are evicted
            assert store.put_many(NS, [(k, k * (BLOB // 8), 0)], tenant="q").stored == 1
        assert store.stats("q").evictions == 5 and store.stats().evictions == 5
        _put(store, [first[0]])  # the default tenant never held it
        store.put_many(NS, [(first[1], first[1] * (BLOB // 8), 0)], tenant="q")
        default, quota = store.entry(NS, first[0]), store.entry(NS, first[1], tenant="q")
        assert default is not None and not default.proven
        assert quota is not None and quota.proven
        assert policy.state("q", BUDGET).split.learned == 1
        assert policy.state("default", 2 * BUDGET).split.learned == 0


def test_admission_never_loses_a_protected_block(tmp_path: Path) -> None:
    """Protected blocks are outside the order under every policy: a flood of stores, remembered keys and
    reads never evicts them while they fit the protected cap."""
    with _open(tmp_path / "v", "adaptive") as store:
        rules = [_key("rules", i) for i in range(8)]
        _put(store, rules, [BlockMeta(source="rules", protected=True)] * len(rules))
        for i in range(300):
            k = _key("x", i % 60)  # keys come back: ghosts, admissions to main, reads
            _put(store, [k])
            store.get_many(NS, [k])
        assert store.stats().evictions > 100
        assert store.prefix_lookup(NS, rules) == len(rules)
        assert all(e is not None and e.protected for e in (store.entry(NS, k) for k in rules))


def test_the_parts_survive_a_reopen(tmp_path: Path) -> None:
    """Proven is stored with the entry and its bytes are recounted at open, so after a restart read
    blocks still outlive a flood (the learning state itself starts afresh)."""
    hot = [_key("hot", i) for i in range(10)]
    with _open(tmp_path / "v", "adaptive") as store:
        _put(store, hot)
        store.get_many(NS, hot)
        _put(store, [_key("tip", 0)])  # applies the reads (they are written by the next put)
    with _open(tmp_path / "v", "adaptive") as store:
        assert all(e is not None and e.proven for e in (store.entry(NS, k) for k in hot))
        for i in range(200):
            _put(store, [_key("once", i)])
        assert store.prefix_lookup(NS, hot) == 10


def test_switching_a_store_between_lru_and_adaptive_reranks_it(tmp_path: Path) -> None:
    keys = [_key("k", i) for i in range(20)]
    with _open(tmp_path / "v", "adaptive") as store:
        _put(store, keys)
    with Store(tmp_path / "v", BUDGET, sync_mode="fast", policy=LRUPolicy(), maintenance_interval_s=1e6) as s:
        _put(s, [_key("n", i) for i in range(25)])  # lru: the oldest go first, stamped deepest first
        assert s.stats().evictions == 5 and s.stats().used_bytes <= BUDGET
        assert s.prefix_lookup(NS, keys) == 15


# -- the learning state alone ------------------------------------------------------------------------


def test_ghost_lists_move_the_target_both_ways() -> None:
    split = Split(budget=100)
    assert split.target == 50
    split.remember(Part.PROBATION, 1, 10)
    split.remember(Part.MAIN, 2, 10)
    assert split.admit(1, 10, 0.5) is Part.MAIN and split.target == 60
    assert split.admit(2, 10, 0.5) is Part.MAIN and split.target == 50
    assert split.admit(3, 10, 0.5) is Part.PROBATION and split.learned == 2
    assert split.admit(4, 10, 0.9) is Part.MAIN  # importance >= 0.7 starts in main
    split.remember(Part.PROBATION, 5, 10)
    assert split.admit(5, 10, 0.2) is Part.PROBATION  # importance <= 0.3 stays in probation


def test_ghost_lists_are_bounded_by_bytes_and_count(monkeypatch: pytest.MonkeyPatch) -> None:
    split = Split(budget=100)
    for k in range(1000):
        split.remember(Part.PROBATION, k, 10)
    assert split.recent.bytes <= GHOST_BUDGETS * 100 and len(split.recent) == GHOST_BUDGETS * 10
    monkeypatch.setattr("tierkv.vault.policy.learning.MAX_GHOSTS", 7)
    big = Split(budget=10**9)
    for k in range(100):
        big.remember(Part.MAIN, k, 1)
    assert len(big.frequent) == 7 and big.ghost_keys() == 7


def test_noted_evictions_are_remembered_in_order_within_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store only notes an eviction (a list's append); the notes reach the ghost lists in the order
    they were made, bounded as when each is remembered at once."""
    learner = AdaptivePolicy().state("t", 100)
    fkeys = [b"\x02" + NS + _key("v", i) for i in range(1000)]
    for i, fkey in enumerate(fkeys):
        learner.evicted((fkey, 10, i % 2 == 1))
    learner.settle()
    split = learner.split
    assert len(split.recent) == len(split.frequent) == GHOST_BUDGETS * 10
    assert split.recent.bytes == split.frequent.bytes == GHOST_BUDGETS * 100
    assert list(split.recent.keys) == [digest(k) for k in fkeys[-80::2]]  # the newest, oldest first
    assert list(split.frequent.keys) == [digest(k) for k in fkeys[-79::2]]
    monkeypatch.setattr("tierkv.vault.policy.learning.MAX_GHOSTS", 7)
    big = AdaptivePolicy().state("t", 10**9)
    for fkey in fkeys:
        big.evicted((fkey, 1, True))
    big.settle()
    assert len(big.split.frequent) == 7 and big.keys() - len(big._shadow_lru.held) == 7


def test_admission_sees_the_evictions_noted_before_it() -> None:
    """A block evicted earlier in the same write (noted, not yet settled) and stored again is a
    remembered key: it starts in main and moves the target, as when it was remembered at once."""
    learner = AdaptivePolicy().state("t", 100)
    fkey = b"\x02" + NS + _key("back", 0)
    learner.evicted((fkey, 10, False))
    assert learner.admit(fkey, 10, 0.5) is True
    assert learner.split.target == 60 and learner.split.learned == 1
    assert learner.admit(b"\x02" + NS + _key("new", 0), 10, 0.5) is False


def test_the_store_settles_its_learners_notes_after_each_write(tmp_path: Path) -> None:
    """Evictions noted in a Put are in the ghost lists once it returns, with no admission after them."""
    policy = AdaptivePolicy()
    with Store(tmp_path / "s", BUDGET, sync_mode="fast", policy=policy, maintenance_interval_s=1e6) as s:
        _put(s, [_key("fill", i) for i in range(40)])
        _put(s, [_key("new", i) for i in range(3)])
        state = policy.state("default", BUDGET)
        assert s.stats().evictions == 3 and state.split.ghost_keys() == 3


def test_shadows_prefer_recency_where_arc_loses_and_arc_where_it_wins() -> None:
    """A scan of one-off keys with a small hot set read again after more new keys than the shadows hold:
    LRU loses the hot set every time, ARC keeps it in main, so ARC takes the lead; a loop of keys read in
    turn that fits neither favours neither."""
    keys = [k for k in range(200_000) if sampled(k)]
    state = AdaptiveState(budget=16 * 40)
    hot = keys[:10]
    for i, k in enumerate(keys[10:3000]):
        state.observe([(k, 1)], read=False)
        if i % 60 == 0:
            state.observe([(h, 1) for h in hot], read=True)
    assert state.lru_lead < 0  # ARC keeps the hot set that the one-off keys push out of LRU
    assert state.keys() < 16 * 40 * (2 * GHOST_BUDGETS + 2)


def test_a_part_all_leased_sends_the_victim_search_to_the_other(tmp_path: Path) -> None:
    """Main is chosen (probation under its target) but every main entry is leased: the search goes on
    from the start of the order and evicts from probation instead of refusing the Put."""
    with _open(tmp_path / "v", "adaptive") as store:
        pinned = [_key("pin", i) for i in range(20)]  # half the budget, outside the order
        _put(store, pinned, [BlockMeta(source="rules", protected=True)] * 20)
        main = [_key("main", i) for i in range(8)]
        _put(store, main, [BlockMeta(importance=0.9)] * 8)  # important: starts in main
        _put(store, [_key("p", i) for i in range(12)])  # probation: 12 of 40, under its target of 20
        assert store.prefix_lookup(NS, main, lease_ms=10_000) == 8
        outcome = store.put_many(NS, [(_key("new", 0), b"n" * BLOB, 0)])
        assert outcome.stored == 1 and outcome.evicted == 1
        assert store.prefix_lookup(NS, main) == 8 and store.prefix_lookup(NS, pinned) == 20


def test_a_shadow_keeps_the_charge_a_key_was_stored_with() -> None:
    """The store feeds the shadows each key at the tenant's current mean entry size, which moves between
    the key's store and its next read: a hit must move the bytes it was charged, or the parts' byte
    counts drift from what they hold and a later store tries to evict from an empty shadow."""
    state = AdaptiveState(BUDGET)
    keys = [i * 16 for i in range(1, 400)]  # low bits zero: every key is sampled
    for size in (100, 3000, 800, 8000, 300):
        for start in range(0, len(keys), 7):
            batch = [(k, size) for k in keys[start : start + 7]]
            state.observe(batch, read=False)
            state.observe(batch[:3], read=True)
    for shadow in (state._shadow_lru, state._shadow_arc):
        held = {p: sum(shadow.held.parts[p].values()) for p in Part}
        assert shadow.used == held
        assert shadow.total == sum(held.values()) <= shadow.budget


def _shadows_consistent(state: AdaptiveState) -> None:
    """Every shadow holds only sampled keys, within its budget, its byte counts equal to what it holds,
    its ghost lists sampled and within their bounds."""
    for shadow in (state._shadow_lru, state._shadow_arc):
        assert shadow.budget == max(1, state.budget // (state.mask + 1))
        assert not any(k & state.mask for k in shadow.held.where)
        held = {p: sum(shadow.held.parts[p].values()) for p in Part}
        assert shadow.used == held and shadow.total == sum(held.values()) <= shadow.budget
        if shadow.split is not None:
            for ghosts in (shadow.split.recent, shadow.split.frequent):
                assert not any(k & state.mask for k in ghosts.keys)
                assert (
                    ghosts.bytes == sum(size for _, size in ghosts.sizes()) <= GHOST_BUDGETS * shadow.budget
                )
                assert len(ghosts) <= GHOST_BUDGETS * MAX_SHADOW_KEYS


def test_shadows_sample_fewer_keys_rather_than_outgrow_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget of many more blocks than a shadow may hold keys: each time a shadow outgrows the bound,
    both keep only a sample half as large in half the budget, so the learning state stays bounded
    however large the budget; what they keep is still a consistent cache of the smaller sample."""
    monkeypatch.setattr("tierkv.vault.policy.learning.MAX_SHADOW_KEYS", 50)
    rng = random.Random(7)
    state = AdaptiveState(budget=16 * 1000)  # a shadow of 20 keys of 50 bytes, then of 1,000 of 1 byte
    for i in range(3000):  # blocks of 50 bytes first: the shadows evict, and ARC's ghost lists fill
        size = 50 if i < 500 else 1
        batch = [(rng.getrandbits(64) & ~0xF, size) for _ in range(8)]  # each one sampled at first
        mask = state.mask
        state.observe(batch, read=False)
        state.observe(batch[:2], read=True)
        assert len(state._shadow_lru.held) <= 50 and len(state._shadow_arc.held) <= 50
        if state.mask != mask:
            _shadows_consistent(state)  # right after narrowing, before new keys push old ones out
    assert state.mask == (1 << 9) - 1  # 1,000 keys → 500 → … → 31 ≤ 50: five bits more
    _shadows_consistent(state)


def test_a_narrowed_shadow_still_tells_arc_from_recency(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan with a hot set of the test above, in a budget that makes the shadows narrow twice: ARC
    still takes the lead (the hot keys are in the final sample)."""
    monkeypatch.setattr("tierkv.vault.policy.learning.MAX_SHADOW_KEYS", 40)
    rng = random.Random(3)
    state = AdaptiveState(budget=64 * 40)  # 160 keys at 1 in 16, 40 at 1 in 64
    hot = [rng.getrandbits(64) << 6 for _ in range(10)]
    for i in range(40 * 64 * 30):
        state.observe([(rng.getrandbits(64), 1)], read=False)
        if i % (60 * 64) == 0:
            state.observe([(h, 1) for h in hot], read=True)
    assert state.mask == (1 << 6) - 1
    assert state.lru_lead < 0
    _shadows_consistent(state)


def test_the_learning_state_is_bounded_whatever_the_budget() -> None:
    """A budget of millions of blocks: the keys held stay within the stated bound (ghost lists at
    MAX_GHOSTS each, shadows at MAX_SHADOW_KEYS each, the ARC shadow's ghost lists at four times that)."""
    state = AdaptiveState(budget=1 << 40)
    rng = random.Random(1)
    for _ in range(300):
        batch = [(rng.getrandbits(64) & ~0xF, 1000) for _ in range(1000)]
        state.observe(batch, read=False)
    bound = 2 * MAX_GHOSTS + 2 * MAX_SHADOW_KEYS + 2 * GHOST_BUDGETS * MAX_SHADOW_KEYS
    assert len(state._shadow_lru.held) <= MAX_SHADOW_KEYS and state.mask > 0xF
    assert state.keys() <= bound
    _shadows_consistent(state)
