"""The informed online bound: the generator's hidden state as it reports it, the expected times to next
use computed from it, and Belady's rule on those expectations, each against hand-computed figures, brute
force or the offline optimum itself."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from tierkv.bench.trace.conversations import (
    SHAPES,
    ConversationSpec,
    SessionState,
    SharedPrefix,
    generate_conversations,
)
from tierkv.bench.trace.informed import (
    NEVER_USED,
    ExpectedBelady,
    ForecastAdmission,
    FutureForecast,
    HintedLRU,
    Knowledge,
    PresentForecast,
)
from tierkv.bench.trace.reference import work_stream
from tierkv.bench.trace.replay import ReplaySettings, prepare
from tierkv.bench.trace.simulate import LRUCache, Stream, belady, replay

A, B, C, D, E, F = 1, 2, 3, 4, 5, 6
APP = SharedPrefix(("app",), 1, 0.25)


def _stream(*requests: tuple[int, ...]) -> Stream:
    """Blocks of one token, every block of every request looked up."""
    return Stream(tuple((ids, len(ids)) for ids in requests), 1, sum(len(r) for r in requests))


def _state(
    session: int,
    *,
    left: int,
    think_s: float,
    carried: int,
    turn: int = 0,
    shared: tuple[SharedPrefix, ...] = (),
    arrival_rate: float = 2.0,
) -> SessionState:
    return SessionState(session, turn, left, think_s, carried, shared, arrival_rate, 0.0)


def _small(shape: str, requests: int = 300) -> tuple[Stream, list[SessionState]]:
    states: list[SessionState] = []
    spec = ConversationSpec(shape=shape, seed=3, requests=requests)
    trace = generate_conversations(spec, states.append)
    work = prepare(trace, ReplaySettings(block_tokens=spec.block_tokens))
    return work_stream(work), states


@pytest.mark.parametrize("shape", SHAPES)
def test_observing_the_generator_changes_no_trace_and_reports_each_sessions_state(shape: str) -> None:
    spec = ConversationSpec(shape=shape, seed=1, requests=400)
    states: list[SessionState] = []
    assert generate_conversations(spec, states.append) == generate_conversations(spec)
    trace = generate_conversations(spec)
    assert len(states) == len(trace.requests)
    seen: dict[int, SessionState] = {}
    for state, request in zip(states, trace.requests, strict=True):
        before = seen.get(state.session)
        assert state.turn == (0 if before is None else before.turn + 1)
        if before is not None:  # one turn fewer left, the same pace, never a request after the last
            assert (state.left, state.think_s) == (before.left - 1, before.think_s) and before.left > 0
        assert state.shared and all(0 < p.share <= 1 for p in state.shared)
        assert state.shared[-1].tokens <= state.carried <= request.length
        if shape != "docs":  # the next prompt resends this one whole
            assert state.carried == request.length
        assert state.clock_s * 1000 == pytest.approx(request.timestamp, abs=0.5)
        seen[state.session] = state
    assert any(s.left == 0 for s in states) and any(s.turn > 0 for s in states)


def test_a_finished_sessions_own_blocks_are_never_used_again_and_a_shared_prefix_still_is() -> None:
    states = [_state(0, left=0, think_s=10.0, carried=3, turn=2, shared=(APP,))]
    forecast = PresentForecast(states, 1)
    forecast.advance(0)
    shared, own = forecast.group(0, 0), forecast.group(0, 1)
    assert forecast.expected(shared) == pytest.approx(1 / (2.0 * 0.25))  # new sessions choosing the app
    assert forecast.expected(own) == math.inf
    assert forecast.group(0, 3) == NEVER_USED and forecast.expected(NEVER_USED) == math.inf


def test_a_shared_prefix_is_next_used_at_the_sum_of_its_users_rates() -> None:
    states = [
        _state(0, left=2, think_s=5.0, carried=2, shared=(APP,)),
        _state(1, left=1, think_s=50.0, carried=2, shared=(APP,)),
        _state(0, left=0, think_s=5.0, carried=3, turn=1, shared=(APP,)),
    ]
    forecast = PresentForecast(states, 1)
    group = ("shared", APP.parts)
    forecast.advance(0)
    forecast.advance(1)
    assert forecast.expected(group) == pytest.approx(1 / (0.5 + 1 / 5 + 1 / 50))
    assert forecast.expected(forecast.group(0, 1)) == pytest.approx(5.0)  # memoryless: its mean
    assert forecast.expected(forecast.group(1, 1)) == pytest.approx(50.0)
    forecast.advance(2)  # session 0 made its last request
    assert forecast.expected(group) == pytest.approx(1 / (0.5 + 1 / 50))
    assert forecast.expected(forecast.group(0, 1)) == math.inf


def _brute_rate(stream: Stream, states: Sequence[SessionState], t: int, index: int) -> float:
    """Block ``index`` of request ``t``'s rate of use, found from the blocks themselves: every session
    whose latest prompt so far resends it (and has turns left), and new sessions whose prompts start
    with it."""
    block, bt = stream.requests[t][0][index], stream.block_tokens
    latest = {states[u].session: u for u in range(t + 1)}
    rate = 0.0
    for u in latest.values():
        state = states[u]
        if state.left > 0 and block in stream.requests[u][0][: state.carried // bt]:
            rate += 1 / state.think_s
    covering = [p for p in states[t].shared if (index + 1) * bt <= p.tokens]
    return rate + (states[t].arrival_rate * covering[0].share if covering else 0.0)


@pytest.mark.parametrize("shape", SHAPES)
def test_expectations_on_a_generated_trace_match_brute_force_over_its_sessions(shape: str) -> None:
    stream, states = _small(shape, 150)
    forecast = PresentForecast(states, stream.block_tokens)
    finite = 0
    for t, (ids, _) in enumerate(stream.requests):
        forecast.advance(t)
        for i in range(len(ids)):
            rate = _brute_rate(stream, states, t, i)
            expected = forecast.expected(forecast.group(t, i))
            assert expected == (pytest.approx(1 / rate) if rate else math.inf), (t, i)
            finite += rate > 0
    assert finite > len(stream.requests)


def test_memoryless_sessions_blocks_rank_by_their_think_time_mean() -> None:
    # session 0 thinks 5 s on average, session 1 50 s: with room for three blocks the informed cache
    # keeps session 0's chain whole and does not store session 1's deeper block; LRU evicts A for D
    stream = _stream((A, B), (C, D), (A, B, E))
    states = [
        _state(0, left=1, think_s=5.0, carried=2),
        _state(1, left=1, think_s=50.0, carried=2),
        _state(0, left=0, think_s=5.0, carried=3, turn=1),
    ]
    informed = ExpectedBelady(3, stream, PresentForecast(states, 1))
    assert replay(stream, informed) == [0, 0, 2]
    assert informed.holds(C) and not informed.holds(D) and len(informed) == 3
    assert replay(stream, LRUCache(3)) == [0, 0, 0]
    # without bypass D goes in over C, the slower session's only other block
    informed = ExpectedBelady(3, stream, PresentForecast(states, 1), bypass=False)
    assert replay(stream, informed) == [0, 0, 2]
    assert informed.holds(D) and not informed.holds(C)


def test_the_slowest_sessions_blocks_go_first_deepest_first() -> None:
    stream = _stream((A, B), (C, D), (E,))
    states = [
        _state(0, left=3, think_s=50.0, carried=2),
        _state(1, left=3, think_s=5.0, carried=2),
        _state(2, left=3, think_s=1.0, carried=1),
    ]
    informed = ExpectedBelady(3, stream, PresentForecast(states, 1))
    replay(stream, informed)
    # D (5 s) takes the place of B, the slowest session's deepest block; then E (1 s) that of A
    assert [informed.holds(b) for b in (A, B, C, D, E)] == [False, False, True, True, True]
    assert informed.evictions == 2


def _chains(rng: random.Random) -> Stream:
    """Requests down a small tree of prefixes (equal ids are equal prefixes), some blocks not looked up."""
    reqs = []
    for _ in range(rng.randint(5, 40)):
        path = (rng.randint(0, 2), *(rng.randint(0, 1) for _ in range(rng.randint(0, 4))))
        ids = tuple(hash(path[: j + 1]) % 10_000 for j in range(len(path)))
        reqs.append((ids, rng.randint(max(0, len(ids) - 1), len(ids))))
    return Stream(tuple(reqs), 1, sum(len(ids) for ids, _ in reqs))


@pytest.mark.parametrize("bypass", [True, False])
def test_with_the_future_as_its_state_it_is_belady(bypass: bool) -> None:
    rng = random.Random(7)
    for _ in range(300):
        stream = _chains(rng)
        capacity = rng.randint(0, stream.distinct)
        informed = ExpectedBelady(capacity, stream, FutureForecast(stream), bypass=bypass)
        assert replay(stream, informed) == belady(stream, capacity, bypass=bypass)
    for shape in SHAPES:
        stream, _ = _small(shape, 200)
        for capacity in (5, 40, 200):
            informed = ExpectedBelady(capacity, stream, FutureForecast(stream), bypass=bypass)
            assert replay(stream, informed) == belady(stream, capacity, bypass=bypass)


class _Bounded(ExpectedBelady):
    """Checks the capacity after every store."""

    def store(self, blocks: Sequence[int]) -> None:
        super().store(blocks)
        assert len(self) <= self.capacity


@pytest.mark.parametrize("shape", SHAPES)
def test_the_informed_cache_never_holds_more_than_its_capacity_and_gains_on_lru(shape: str) -> None:
    stream, states = _small(shape)
    for capacity in (0, 1, 7, 60):
        informed = _Bounded(capacity, stream, PresentForecast(states, stream.block_tokens))
        hits = replay(stream, informed)
        if capacity == 60:
            assert sum(hits) >= sum(replay(stream, LRUCache(capacity)))
            assert len(informed) == capacity


def test_admission_stores_only_blocks_more_likely_than_not_used_within_the_horizon() -> None:
    # session 0's blocks are expected in 5 s: P(within h) = 1 - exp(-h / 5) > 1/2 from h = 5 ln 2 = 3.47 s
    stream = _stream((A, B), (A, B, C))
    states = [_state(0, left=1, think_s=5.0, carried=2), _state(0, left=0, think_s=5.0, carried=3, turn=1)]
    for horizon, hits in ((3.6, [0, 2]), (3.4, [0, 0])):
        admission = ForecastAdmission(LRUCache(4), stream, PresentForecast(states, 1), horizon)
        assert replay(stream, admission) == hits
        assert not admission.holds(C)  # a finished session's block: never


def test_lru_told_the_ends_does_not_store_dead_blocks_and_evicts_them_first() -> None:
    stream = _stream((A, B), (C,), (A, B, D), (E,), (C, F))
    states = [
        _state(0, left=1, think_s=5.0, carried=2),
        _state(1, left=1, think_s=5.0, carried=1),
        _state(0, left=0, think_s=5.0, carried=3, turn=1),  # session 0 ends: A B to the cold end, B coldest
        _state(2, left=1, think_s=5.0, carried=1),
        _state(1, left=0, think_s=5.0, carried=2, turn=1),
    ]
    hinted = HintedLRU(3, stream, PresentForecast(states, 1))
    # E takes B's place, so C is still there for session 1; LRU had evicted C for D
    assert replay(stream, hinted) == [0, 0, 2, 0, 1]
    assert replay(stream, LRUCache(3)) == [0, 0, 2, 0, 0]
    assert [hinted.holds(b) for b in (A, B, C, D, E, F)] == [True, False, True, False, True, False]
    # without the ends it is LRU
    blind = HintedLRU(3, stream, PresentForecast(states, 1, Knowledge(ends=False)))
    assert replay(stream, blind) == replay(stream, LRUCache(3))


@pytest.mark.parametrize("shape", SHAPES)
def test_lru_told_the_ends_never_holds_more_than_its_capacity(shape: str) -> None:
    stream, states = _small(shape)
    for capacity in (0, 1, 7, 60):
        hinted = HintedLRU(capacity, stream, PresentForecast(states, stream.block_tokens))
        replay(stream, hinted)
        assert len(hinted) <= capacity


def test_each_piece_of_knowledge_can_be_taken_away() -> None:
    states = [
        _state(0, left=0, think_s=5.0, carried=2, turn=3, shared=(APP,)),
        _state(1, left=2, think_s=50.0, carried=2, shared=(APP,)),
    ]
    group = ("shared", APP.parts)

    def forecast(knows: Knowledge) -> PresentForecast:
        out = PresentForecast(states, 1, knows)
        out.advance(0)
        out.advance(1)
        return out

    assert forecast(Knowledge()).expected(group) == pytest.approx(1 / (0.5 + 1 / 50))
    assert forecast(Knowledge(ends=False)).expected(group) == pytest.approx(1 / (0.5 + 1 / 5 + 1 / 50))
    assert forecast(Knowledge(ends=False)).expected(("session", 0)) == pytest.approx(5.0)
    assert forecast(Knowledge(paces=False, common_think_s=20)).expected(group) == pytest.approx(1 / 0.55)
    assert forecast(Knowledge(arrivals=False)).expected(group) == pytest.approx(50.0)


def test_a_prefix_whose_last_live_user_left_has_no_users_exactly() -> None:
    # rates 0.1 + 0.2 + 0.3 added and taken away again do not sum to 0.0 in floating point
    thinks = (10.0, 5.0, 10 / 3)
    states = [_state(k, left=1, think_s=s, carried=2, shared=(APP,)) for k, s in enumerate(thinks)]
    states += [_state(k, left=0, think_s=s, carried=2, turn=1, shared=(APP,)) for k, s in enumerate(thinks)]
    forecast = PresentForecast(states, 1, Knowledge(arrivals=False))
    for t in range(len(states)):
        forecast.advance(t)
    assert forecast.expected(("shared", APP.parts)) == math.inf
