"""The admission bounds of the retention page: an oracle that admits only blocks looked up again (in
time), the LRU lifetime its horizon is measured in, and the rates of reuse per class of arriving block,
each against a trace small enough to count by hand."""

from __future__ import annotations

import random

from tierkv.bench.trace.bounds import (
    EXTENDED_RECENT,
    EXTENDED_SECONDS,
    EXTENDED_STALE,
    FAN_OUTS,
    HIT_RECENT,
    HIT_STALE,
    LAST_OF_PUT,
    NEW,
    SINGLE_PUT,
    TURNS,
    OracleAdmission,
    arrival_rates,
    continuation_rates,
    lru_lifetime,
)
from tierkv.bench.trace.simulate import AdaptiveCache, LRUCache, Stream, replay

A, B, C, D = 1, 2, 3, 4
E, F, G, X, Y = 5, 6, 7, 8, 9


def _stream(*requests: tuple[int, ...]) -> Stream:
    """Every block of every request looked up (its prompt's last token is past its last block)."""
    return Stream(tuple((ids, len(ids)) for ids in requests), 1, sum(len(r) for r in requests))


def test_the_oracle_stores_only_blocks_looked_up_again_in_time() -> None:
    # one block of room: LRU stores B over A and misses A; the oracle knows B never comes back
    stream = _stream((A,), (B,), (A,))
    assert replay(stream, LRUCache(1)) == [0, 0, 0]
    assert replay(stream, OracleAdmission(LRUCache(1), stream, None)) == [0, 0, 1]
    # A comes back two requests later: a horizon of one refuses it, two admits it
    assert replay(stream, OracleAdmission(LRUCache(1), stream, 1)) == [0, 0, 0]
    assert replay(stream, OracleAdmission(LRUCache(1), stream, 2)) == [0, 0, 1]


def test_the_oracle_judges_each_block_of_a_chain_by_its_own_next_lookup() -> None:
    # A B C stored; only A B are looked up again: C is refused, so A B fit two blocks of room
    stream = _stream((A, B, C), (A, B), (A, B, D))
    oracle = OracleAdmission(LRUCache(2), stream, None)
    assert replay(stream, oracle) == [0, 2, 2]
    assert not oracle.holds(C) and not oracle.holds(D) and len(oracle) == 2
    assert replay(stream, LRUCache(2)) == [0, 0, 2]  # LRU keeps B C after the first: the lookup misses A


def _chains(rng: random.Random) -> Stream:
    """Requests down a small tree of prefixes (equal ids are equal prefixes), as the traces are."""
    reqs = []
    for _ in range(rng.randint(5, 30)):
        path = (rng.randint(0, 2), *(rng.randint(0, 1) for _ in range(rng.randint(0, 3))))
        reqs.append(tuple(hash(path[: j + 1]) % 10_000 for j in range(len(path))))
    return _stream(*reqs)


def test_with_room_for_everything_the_oracle_loses_no_hit_and_stores_only_what_comes_back() -> None:
    rng = random.Random(5)
    for _ in range(60):
        stream = _chains(rng)
        room = stream.distinct
        oracle = OracleAdmission(LRUCache(room), stream, None)
        assert replay(stream, oracle) == replay(stream, LRUCache(room))
        later = {b for t, (ids, _) in enumerate(stream.requests) for b in ids[: stream.requests[t][1]] if t}
        assert all(b in later for ids, _ in stream.requests for b in ids if oracle.holds(b))
        never = OracleAdmission(AdaptiveCache(room), stream, 0)  # nothing comes back within 0 requests
        assert sum(replay(stream, never)) == 0 and len(never) == 0


def test_the_lru_lifetime_is_the_capacity_over_evictions_per_request() -> None:
    stream = _stream((A,), (B,), (C,), (D,))
    assert lru_lifetime(stream, 4) == 4  # nothing evicted: the whole trace
    assert lru_lifetime(stream, 2) == 2 * 4 // 2  # two evictions in four requests
    assert lru_lifetime(stream, 1) == 1 * 4 // 3


def test_arrival_rates_count_each_class_of_block_by_hand() -> None:
    # t0 stores A B; t1 hits A B and stores C; t2 stores D alone; t3 hits A (last used at t1) and C
    stream = _stream((A, B), (A, B, C), (D,), (A, C))
    rates = arrival_rates(stream, 2)
    assert rates.counts[NEW] == 4 and rates.soon[NEW] == 3  # A, B, C back within 2; D never
    assert rates.counts[LAST_OF_PUT] == 3 and rates.soon[LAST_OF_PUT] == 2  # B (t1) and C (t3); not D
    assert rates.counts[SINGLE_PUT] == 2 and rates.rate(SINGLE_PUT) == 0.5  # C at t1 (back), D (never)
    # hits: A and B at t1 (last used 1 request ago: not within a quarter of 2, not 2 or more), A at t3
    # (2 ago: stale, never back), C at t3 (2 ago: stale, never back)
    assert rates.counts[HIT_RECENT] == 0 and rates.rate(HIT_RECENT) is None
    assert rates.counts[HIT_STALE] == 2 and rates.soon[HIT_STALE] == 0
    # a longer horizon: A and B at t1 (1 ago) are recent, A back at t3 and B never; t3's hits are between
    longer = arrival_rates(stream, 4)
    assert longer.counts[HIT_RECENT] == 2 and longer.rate(HIT_RECENT) == 0.5 and not longer.counts[HIT_STALE]


def test_continuation_rates_count_turns_and_the_time_since_the_chain_was_extended_by_hand() -> None:
    # a conversation A B → C → D → F → G (turns 0, 1, 2, 3, 3 capped), a fresh E, then B extended twice
    # more (X at t6, Y at t7): each extension of B counts from B's previous one, not from B's store
    stream = _stream(
        (A, B), (A, B, C), (A, B, C, D), (E,), (A, B, C, D, F), (A, B, C, D, F, G), (A, B, X), (A, B, Y)
    )
    times = [0.0, 5_000.0, 8_000.0, 9_000.0, 80_000.0, 85_000.0, 200_000.0, 201_000.0]
    rates = continuation_rates(stream, 4, times)
    # back within 4 requests: A B (t1), C (t2), D (t4), F (t5); never: E, G, X, Y
    assert (rates.counts[TURNS[0]], rates.soon[TURNS[0]]) == (3, 2)  # A B E
    assert (rates.counts[TURNS[1]], rates.soon[TURNS[1]]) == (3, 1)  # C X Y
    assert (rates.counts[TURNS[2]], rates.soon[TURNS[2]]) == (1, 1)  # D
    assert (rates.counts[TURNS[3]], rates.soon[TURNS[3]]) == (2, 1)  # F G
    # requests since the parent's chain was extended: C 1, D 1, F 2, G 1, X 5 (B extended at t1), Y 1
    assert (rates.counts[EXTENDED_RECENT], rates.soon[EXTENDED_RECENT]) == (4, 2)  # C D G Y (≤ 4/4)
    assert (rates.counts[EXTENDED_STALE], rates.soon[EXTENDED_STALE]) == (1, 0)  # X (≥ 4)
    # seconds: C 5, D 3, F 72, G 5, X 195, Y 1
    quick, slow = (name for name, _, _ in EXTENDED_SECONDS)
    assert (rates.counts[quick], rates.soon[quick]) == (4, 2)  # C D G Y
    assert (rates.counts[slow], rates.soon[slow]) == (2, 1)  # F X
    # extensions of the parent before: C, D, F, G each their parent's first; X B's second, Y its third
    first, once, few, many = (name for name, _ in FAN_OUTS)
    assert (rates.counts[first], rates.soon[first]) == (4, 3)  # C D F G (G never back)
    assert (rates.counts[once], rates.soon[once]) == (1, 0)  # X
    assert (rates.counts[few], rates.soon[few]) == (1, 0) and not rates.counts[many]  # Y
    untimed = continuation_rates(stream, 4, [None] * len(times))
    assert not untimed.counts[quick] and not untimed.counts[slow]
    assert untimed.counts[EXTENDED_RECENT] == 4 and untimed.counts[TURNS[3]] == 2
