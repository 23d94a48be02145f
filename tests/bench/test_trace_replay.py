"""``bench trace`` as a replay of real traffic: hash-id traces, the engine's lookup → read → store order
against a hand-computed trace (real vault processes on loopback), the reference LRU equal to the vault's
``lru``, the offline optimum against brute force, the generated multi-turn shapes."""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pytest

from tests.bench.test_synthetic import bench
from tierkv.bench.common import Deadline
from tierkv.bench.trace import ReadOptions, Request, Trace, TraceError, parse_lines
from tierkv.bench.trace.conversations import SHAPES, ConversationSpec, generate_conversations
from tierkv.bench.trace.model import trace_lines
from tierkv.bench.trace.reference import capacity_blocks, in_process_run, references, work_stream
from tierkv.bench.trace.replay import ALL, ReplaySettings, prepare, replay_one
from tierkv.bench.trace.report import pct
from tierkv.bench.trace.simulate import AdaptiveCache, LRUCache, Stream, belady, replay

BT = 4
BLOB = 256 * 1024
OPTS = ReadOptions(block_tokens=BT)


def _hash(ids: list[int], length: int, ts: int = 0) -> str:
    return json.dumps({"timestamp": ts, "input_length": length, "output_length": 1, "hash_ids": ids})


# -- hash-id parsing ----------------------------------------------------------------------------------------


def test_hash_id_lines_parse_with_their_timestamps_and_round_trip() -> None:
    trace = parse_lines([_hash([0, 1, 2], 10, 5), _hash([0, 1, 3], 12, 9)], options=OPTS)
    first = trace.requests[0]
    assert first.hash_ids == (0, 1, 2) and first.n_tokens == 10 and first.timestamp == 5.0
    again = parse_lines(list(trace_lines(trace)), options=OPTS)
    assert again.requests == trace.requests


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (_hash([0], 10), "line 2.hash_ids: 1 ids for input_length 10 in blocks of 4 tokens (expected 2 or 3"),
        (_hash([0, 1, 2, 3], 10), "line 2.hash_ids: 4 ids"),
        ('{"input_length": 4, "hash_ids": [0, "x"]}', "line 2.hash_ids[1]: expected a 64-bit integer id"),
        ('{"input_length": -1, "hash_ids": []}', "line 2.input_length: expected a token count"),
        ('{"hash_ids": [0]}', "line 2.input_length"),
        (
            '{"input_length": 4, "hash_ids": [0], "timestamp": "soon"}',
            "line 2.timestamp: expected milliseconds",
        ),
    ],
)
def test_hash_id_errors_name_the_line_and_field(line: str, message: str) -> None:
    with pytest.raises(TraceError) as err:
        parse_lines([_hash([0, 1, 2], 10), line], source="t.jsonl", options=OPTS)
    assert f"t.jsonl {message}" in str(err.value) or message in str(err.value)
    assert "t.jsonl line 2" in str(err.value)


def test_the_agent_format_keeps_timestamps_too() -> None:
    line = '{"tenant": "t", "timestamp": 12.5, "segments": [["s", 3]]}'
    assert parse_lines([line]).requests[0].timestamp == 12.5


# -- the replay, by hand ------------------------------------------------------------------------------------


def _settings(**kw: object) -> ReplaySettings:
    args: dict[str, object] = {
        "policies": ("lru",),
        "capacities": (1.0,),
        "block_tokens": BT,
        "blob_bytes": BLOB,
    }
    return ReplaySettings(**(args | kw))  # type: ignore[arg-type]


def test_replay_looks_up_reads_the_hits_and_stores_the_rest_like_an_engine(tmp_path: Path) -> None:
    lines = [
        _hash([0, 1, 2], 12),  # 3 full blocks, 2 lookable: nothing held yet -> stores 0, 1, 2
        _hash([0, 1, 2, 3], 14),  # 3 full blocks (the 4th partial), lookable 3: hits 0, 1, 2
        _hash([0, 1, 4], 12),  # lookable 2: hits 0, 1 (block 2 holds the last token); stores 4
        _hash([5], 3),  # shorter than a block: nothing to look up or store
        _hash([0, 6, 7], 9),  # lookable 2: hits 0, then misses 6; stores 6 (7 is partial)
    ]
    trace = parse_lines(lines, options=OPTS)
    s = _settings(lease_ms=0)  # a lease may cover a quarter of the budget: 1 of these 6 big blocks
    work = prepare(trace, s)
    assert [r.lookable for r in work.requests] == [2, 3, 2, 0, 2]
    assert [len(r.keys) for r in work.requests] == [3, 3, 3, 0, 2]
    run = replay_one(work, s, "lru", 1.0, tmp_path, lambda: None, Deadline(120))
    assert run is not None
    hits = [0, 3, 2, 0, 1]
    assert run.tally(ALL).hits == sum(hits) and run.hit_tokens == sum(hits) * BT
    assert run.vault_hits == sum(hits)  # every hit was read from the vault, and counted there
    assert run.tally(ALL).stored == 3 + 0 + 1 + 0 + 1
    assert run.stored_keys == work.distinct == 5 and run.lost == 0 and run.unacked == 0
    assert run.prompt_tokens == 12 + 14 + 12 + 3 + 9


def test_a_request_shorter_than_a_block_is_replayed_in_both_formats(tmp_path: Path) -> None:
    agent = Request("t", ({"tokens": [0, 3], "source": "user_turn"},), segments=(("s", 3),))
    trace = Trace((agent, agent))
    s = _settings(policies=("context",))
    work = prepare(trace, s)
    assert work.distinct == 0 and all(not r.keys for r in work.requests)


def _chat(requests: int, seed: int = 0) -> Trace:
    return generate_conversations(ConversationSpec("chat", seed, requests, BT * 4))


def test_the_vault_lru_gives_exactly_the_reference_lru(tmp_path: Path) -> None:
    trace = _chat(300)
    s = _settings(block_tokens=16, blob_bytes=2048, capacities=(0.1,), lease_ms=0)
    work = prepare(trace, s)
    stream = work_stream(work)
    (ref,) = references(work, stream, [0.1])
    run = replay_one(work, s, "lru", 0.1, tmp_path, lambda: None, Deadline(300))
    assert run is not None and run.evictions > 0
    assert run.token_hit_rate == ref.lru
    assert ref.lru <= ref.optimum <= ref.optimum_bypass + 1e-12 or ref.optimum_bypass <= ref.optimum


# -- the optimum against brute force --------------------------------------------------------------------


def _brute(stream: Stream, capacity: int, bypass: bool) -> int:
    """The most block hits any sequence of eviction (and, with bypass, admission) choices gets."""
    reqs = stream.requests

    @functools.cache
    def from_request(t: int, held: frozenset[int]) -> int:
        if t == len(reqs):
            return 0
        ids, lookable = reqs[t]
        hit = 0
        while hit < lookable and ids[hit] in held:
            hit += 1
        return hit + place(t, 0, held)

    @functools.cache
    def place(t: int, i: int, held: frozenset[int]) -> int:
        ids, _ = reqs[t]
        if i == len(ids):
            return from_request(t + 1, held)
        b = ids[i]
        if b in held or len(held) < capacity:
            return place(t, i + 1, held | {b})
        best = max(place(t, i + 1, (held - {v}) | {b}) for v in held)
        return max(best, place(t, i + 1, held)) if bypass else best

    return from_request(0, frozenset())


def _single_block_stream(rng: random.Random) -> Stream:
    n = rng.randint(4, 12)
    return Stream(tuple(((rng.randint(0, 4),), 1) for _ in range(n)), 1, n)


def _chain_stream(rng: random.Random) -> Stream:
    reqs = []
    for _ in range(rng.randint(3, 7)):
        path: tuple[int, ...] = (rng.randint(0, 1),)
        for _ in range(rng.randint(0, 3)):
            path += (rng.randint(1, 2),)
        ids = tuple(hash(path[: j + 1]) % 1000 for j in range(len(path)))
        reqs.append((ids, rng.randint(0, len(ids))))
    return Stream(tuple(reqs), 1, 1)


@pytest.mark.parametrize("bypass", [False, True])
def test_belady_is_the_optimum_on_single_block_requests(bypass: bool) -> None:
    rng = random.Random(7)
    for _ in range(150):
        stream, capacity = _single_block_stream(rng), rng.randint(1, 3)
        assert sum(belady(stream, capacity, bypass=bypass)) == _brute(stream, capacity, bypass)


@pytest.mark.parametrize("bypass", [False, True])
def test_belady_on_chains_never_beats_brute_force_and_never_loses_to_lru(bypass: bool) -> None:
    rng = random.Random(11)
    equal = 0
    for _ in range(150):
        stream, capacity = _chain_stream(rng), rng.randint(1, 3)
        best, got = _brute(stream, capacity, bypass), sum(belady(stream, capacity, bypass=bypass))
        assert got <= best
        assert got >= sum(replay(stream, LRUCache(capacity)))
        equal += got == best
    assert equal >= 140  # the farthest-next-use rule is the optimum on nearly every small chain trace


@pytest.mark.parametrize("bypass", [False, True])
def test_belady_drops_stale_heap_entries_without_changing_a_hit(
    bypass: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The optimum's heap is rebuilt from the live entries as stale ones pile up: the same hits whether it
    is rebuilt at every chance or never."""
    from tierkv.bench.trace import simulate

    stream = work_stream(prepare(_chat(1500), _settings(block_tokens=16, blob_bytes=2048)))
    for capacity in (20, 200):
        monkeypatch.setattr(simulate._Farthest, "slack", 0)
        eager = belady(stream, capacity, bypass=bypass)
        monkeypatch.setattr(simulate._Farthest, "slack", 1 << 60)
        assert eager == belady(stream, capacity, bypass=bypass) and sum(eager) > 0


# -- generated shapes and the report ----------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_generated_shapes_are_deterministic_timed_and_reuse_prefixes(shape: str) -> None:
    a, b = (generate_conversations(ConversationSpec(shape, 1, 300)) for _ in range(2))
    other = generate_conversations(ConversationSpec(shape, 2, 300))
    assert a.requests == b.requests != other.requests and len(a.requests) == 300
    times = [r.timestamp or 0.0 for r in a.requests]
    assert times == sorted(times) and times[-1] > 0
    work = prepare(a, _settings(block_tokens=512))
    ceiling = work.ceiling()[ALL]
    assert 0.2 < ceiling.possible / ceiling.blocks < 0.99  # reuse, but not everything


def test_adaptive_twin_keeps_at_least_what_lru_keeps_on_a_chat_trace() -> None:
    work = prepare(_chat(1500, 3), _settings(block_tokens=16))
    stream = work_stream(work)
    blocks = capacity_blocks(work, 0.05)
    assert sum(replay(stream, AdaptiveCache(blocks))) >= sum(replay(stream, LRUCache(blocks)))


def test_capacities_print_with_the_precision_given() -> None:
    assert [pct(c) for c in (0.005, 0.02, 0.1, 0.125, 1.0)] == ["0.5%", "2%", "10%", "12.5%", "100%"]


def test_command_replays_a_hash_id_trace_in_process_beside_the_references(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl"
    path.write_text("\n".join(trace_lines(_chat(400))) + "\n")
    out = tmp_path / "r.json"
    result = bench(
        "trace", "--trace", str(path), "--trace-block-tokens", "16", "--in-process", "--policies",
        "lru,adaptive", "--capacities", "2.5%,10%", "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    refs = {r["fraction"]: r for r in doc["references"]}
    assert set(refs) == {0.025, 0.1}
    lru = [g for g in doc["gap_closed"] if g["policy"] == "lru"]
    assert all(g["token_hit_rate"] == refs[g["fraction"]]["lru"] and g["gap_closed"] == 0 for g in lru)
    assert "2.5%" in result.stdout


def test_the_vault_adaptive_gives_exactly_its_in_process_twin(tmp_path: Path) -> None:
    """The twin the bench runs in process is the vault's policy: same hits, request by request."""
    trace = _chat(300, 2)
    s = _settings(block_tokens=16, blob_bytes=2048, capacities=(0.1,), lease_ms=0, policies=("adaptive",))
    work = prepare(trace, s)
    vault = replay_one(work, s, "adaptive", 0.1, tmp_path, lambda: None, Deadline(300))
    twin = in_process_run(work, work_stream(work), "adaptive", 0.1, s)
    assert vault is not None and vault.evictions > 0
    assert vault.tally(ALL).hits == twin.tally(ALL).hits and vault.evictions == twin.evictions


def test_format_hash_ids_names_a_line_that_is_not_one() -> None:
    lines = [_hash([0, 1, 2], 10), '{"tenant": "t", "segments": [["s", 3]]}']
    with pytest.raises(TraceError, match=r"t.jsonl line 2: not a hash-id request"):
        parse_lines(lines, source="t.jsonl", options=ReadOptions(block_tokens=BT, fmt="hash-ids"))
    assert len(parse_lines(lines, options=OPTS).requests) == 2  # auto: each line by its fields
