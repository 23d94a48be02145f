"""The connector's restore and store rules, without vLLM."""

from __future__ import annotations

import hashlib

import pytest

from tierkv.codec import LayerGroup
from tierkv.connectors.vllm.plan import (
    KV,
    STATE,
    BlockRef,
    GroupPlan,
    Topology,
    Window,
    claimed_tokens,
    finished_refs,
    load_refs,
    make_topology,
    restore_window,
    snapshot_refs,
    state_candidates,
)

BS = 16
KEYS = [hashlib.sha256(bytes([i])).digest() for i in range(10)]


def attention_only() -> Topology:
    return make_topology([GroupPlan(0, KV, BS, ("l0", "l1"))], [], BS)


def hybrid() -> Topology:
    return make_topology([GroupPlan(0, KV, BS, ("attn",)), GroupPlan(1, STATE, BS, ("ssm",))], [], BS)


@pytest.mark.parametrize(
    ("num_tokens", "computed", "window"),
    [
        (64, 0, Window(0, 3)),  # 4 full blocks: the last one holds the last token, so 3
        (65, 0, Window(0, 4)),
        (16, 0, Window(0, 0)),
        (1, 0, Window(0, 0)),
        (100, 32, Window(2, 6)),
        (100, 96, Window(6, 6)),
        (100, 40, Window(0, 0)),  # local hit ends inside a block
    ],
)
def test_restore_window_leaves_at_least_one_token(num_tokens: int, computed: int, window: Window) -> None:
    got = restore_window(num_tokens, computed, BS, num_keys=10)
    assert got == window
    if got.size:
        assert got.stop * BS < num_tokens


def test_restore_window_is_bounded_by_the_keys() -> None:
    assert restore_window(1000, 0, BS, num_keys=3) == Window(0, 3)


def test_claimed_tokens_never_exceed_the_window() -> None:
    window = Window(2, 5)
    assert claimed_tokens(window, 0, BS) == 0
    assert claimed_tokens(window, 2, BS) == 2 * BS
    assert claimed_tokens(window, 9, BS) == 3 * BS


def test_state_candidates_walk_back_from_the_kv_hit() -> None:
    assert state_candidates(Window(0, 8), kv_hits=5, max_probes=3) == [5, 4, 3]
    assert state_candidates(Window(0, 2), kv_hits=5, max_probes=3) == [2, 1]
    assert state_candidates(Window(0, 8), kv_hits=0, max_probes=3) == []


def test_block_keys_use_the_hash_at_each_block_end() -> None:
    topo = make_topology([GroupPlan(0, KV, 32, ("l",))], [], hash_block_size=16)
    assert topo.hashes_per_block == 2
    assert topo.block_keys(KEYS[:5]) == [KEYS[1], KEYS[3]]
    assert topo.block_keys(KEYS[:6], start=1) == [KEYS[3], KEYS[5]]


def test_topology_refuses_what_it_cannot_restore_exactly() -> None:
    assert attention_only().restorable
    assert not make_topology([GroupPlan(0, KV, BS, ("l",))], ["group 1 (SlidingWindowSpec)"], BS).restorable
    mixed = make_topology([GroupPlan(0, KV, 16, ("a",)), GroupPlan(1, STATE, 32, ("s",))], [], 16)
    assert "different block sizes" in mixed.unsupported
    assert "multiple" in make_topology([GroupPlan(0, KV, 24, ("a",))], [], 16).unsupported
    assert not make_topology([], [], 16).restorable


def test_streams_route_kv_and_states_to_their_roles() -> None:
    streams = hybrid().streams
    assert [(s.tag, s.layer_group, s.role) for s in streams] == [
        ("g0.kv0", LayerGroup.ATTENTION, "kv_cold"),
        ("g1.state0", LayerGroup.SSM, "ssm_cold"),
    ]


def test_load_refs_cover_every_kv_position_and_the_last_state() -> None:
    topo = hybrid()
    block_ids = [[11, 12, 13, 14], [0, 0, 23, 0]]
    refs = load_refs(topo, KEYS, block_ids, Window(1, 3))
    assert refs == [
        BlockRef(0, 1, 12, KEYS[1]),
        BlockRef(0, 2, 13, KEYS[2]),
        BlockRef(1, 2, 23, KEYS[2]),
    ]
    assert load_refs(topo, KEYS, block_ids, Window(1, 1)) == []


def test_load_refs_refuse_a_null_block() -> None:
    assert load_refs(hybrid(), KEYS, [[11, 12], [0, 0]], Window(0, 2)) is None
    assert load_refs(attention_only(), KEYS, [[11]], Window(0, 2)) is None


def test_finished_refs_store_full_computed_real_blocks_in_order() -> None:
    topo = hybrid()
    refs = finished_refs(topo, KEYS, [[5, 6, 0, 8, 9], [0, 0, 0, 0, 30]], num_computed=4 * BS + 3)
    assert [(r.group, r.position, r.block_id) for r in refs] == [(0, 0, 5), (0, 1, 6), (0, 3, 8)]
    assert finished_refs(topo, KEYS[:2], [[5, 6, 7]], num_computed=3 * BS) == refs[:2]


def test_snapshot_refs_keep_block_aligned_state_offers_only() -> None:
    topo = hybrid()
    offers = [(1, 40, 2 * BS), (1, 41, 2 * BS + 5), (0, 42, BS), (1, 0, BS), (1, 43, 99 * BS)]
    assert snapshot_refs(topo, KEYS, offers) == [BlockRef(1, 1, 40, KEYS[1])]
