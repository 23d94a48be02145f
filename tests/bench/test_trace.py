"""``tierkv bench trace``: the seeded generator, the JSONL format and its parser, replay through real vaults
(real ``tierkv vault`` processes on loopback, real LMDB) and the command end to end, all kept tiny."""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
import string
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from tests.bench.test_synthetic import bench
from tierkv.bench.common import Deadline
from tierkv.bench.trace import Request, Trace, TraceError, TraceSpec, generate, parse_lines
from tierkv.bench.trace.model import segment_tokens, trace_lines
from tierkv.bench.trace.replay import (
    ALL,
    IMPORTANT_GROUP,
    PROTECTED,
    Blobs,
    PolicyRun,
    Replayer,
    ReplaySettings,
    Tally,
    Workload,
    prepare,
    replay_one,
)
from tierkv.bench.trace.report import targets, write_chart
from tierkv.bench.trace.run import TraceSettings, run_trace
from tierkv.client.cluster import Cluster
from tierkv.errors import BenchError

TINY = TraceSpec(seed=3, tenants=2, agents=1, sessions=2, turns=3, doc_tokens=(256, 512))

# -- generator and format ---------------------------------------------------------------------------------


def test_generator_is_deterministic_for_a_seed_and_differs_across_seeds() -> None:
    a, b = generate(TINY), generate(TINY)
    assert a.requests == b.requests and a.requests
    other = generate(TraceSpec(seed=4, tenants=2, agents=1, sessions=2, turns=3, doc_tokens=(256, 512)))
    assert other.requests != a.requests


def test_generated_prompts_have_the_documented_shape() -> None:
    trace = generate(TraceSpec(seed=1, tenants=2, agents=2, sessions=3, turns=4))
    by_session: dict[str, list[Request]] = {}
    for r in trace.requests:
        by_session.setdefault(r.session, []).append(r)
        sources = [c["source"] for c in r.layout]
        assert sources[:3] == ["axioms", "identity", "rules"]
        assert 512 <= sum(n for _, n in r.segments[:3]) <= 4096
        assert r.segments[0][0] == f"{r.tenant}/axioms"  # shared by the tenant's agents
        spans = [tuple(c["tokens"]) for c in r.layout]
        assert spans[0][0] == 0 and spans[-1][1] == r.n_tokens
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    for turns in by_session.values():
        for before, after in itertools.pairwise(turns):
            # each turn resends the previous prompt, then the reply, then the new input
            assert after.segments[: len(before.segments)] == before.segments
            assert after.layout[len(before.layout)]["source"] == "generation"
    agents = {r.agent: r.segments[:3] for r in trace.requests}
    assert all(r.segments[:3] == agents[r.agent] for r in trace.requests)
    assert len(by_session) == 2 * 2 * 3


def test_jsonl_round_trips(tmp_path: Path) -> None:
    trace = generate(TINY)
    text = list(trace_lines(trace))
    back = parse_lines(text, "t.jsonl")
    assert back.requests == trace.requests and back.generator["seed"] == 3
    explicit = Request("t9", ({"tokens": [0, 3], "source": "rules", "priority": 5},), tokens=(1, 2, 3))
    again = parse_lines([json.dumps(explicit.to_json())]).requests[0]
    assert again == explicit and list(again.token_ids()) == [1, 2, 3]


def test_segments_expand_the_same_everywhere() -> None:
    assert segment_tokens("t0/axioms", 4).tolist() == segment_tokens("t0/axioms", 9)[:4].tolist()
    assert segment_tokens("t0/axioms", 4).tolist() != segment_tokens("t1/axioms", 4).tolist()
    # pinned: a change here changes every published trace's token ids
    assert segment_tokens("a", 3).tolist() == [54080, 77701, 22]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"tenant": "t", "segments": [["s", 4]]}', "{nope"], "t.jsonl line 2: not a JSON value"),
        (['{"tenant": "t", "segments": [["s", -1]]}'], "line 1.segments[0]: expected [id, length]"),
        (['{"tenant": "t", "tokens": [1], "segments": []}'], "exactly one of 'segments' or 'tokens'"),
        (['{"segments": [["s", 4]]}'], "line 1.tenant: expected a non-empty string"),
        (['{"tenant": "t", "tokens": [1, 2], "layout": [{"tokens": [0, 3]}]}'], "past the 2 tokens"),
        (['{"tenant": "t", "tokens": [1], "layout": [{"tokens": [0, 1], "priority": 9}]}'], "layout[0]"),
        (["", '{"tenant": "t", "tokens": [true]}'], "line 2.tokens[0]: expected an int"),
        (['{"tenant": "t", "tokens": [1]}', '{"format": "tierkv-trace", "version": 1}'], "only be the first"),
        (['{"format": "tierkv-trace", "version": 2}'], "version 1"),
        (["[]"], "expected a JSON object"),
        (["", "  "], "no requests"),
    ],
)
def test_bad_lines_are_named(lines: list[str], message: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse_lines(lines, "t.jsonl")
    assert message in str(caught.value)


VALID = json.dumps({"tenant": "t", "segments": [["s", 40]], "layout": [{"tokens": [0, 40], "source": "x"}]})
_json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["tenant", "agent", "segments", "tokens", "layout", "source", "format", "x"]),
            inner,
            max_size=5,
        )
    ),
    max_leaves=12,
)
_chunk = st.dictionaries(
    st.sampled_from(["tokens", "source", "priority", "importance", "durability", "protected", "chars"]),
    _json_leaf | st.lists(_json_leaf, min_size=2, max_size=2),
    max_size=4,
)
_count = _json_leaf | st.integers(-2, 2**32)
_body = st.one_of(
    st.fixed_dictionaries(
        {"segments": st.lists(st.tuples(st.text(max_size=4) | _json_leaf, _count).map(list))}
    ),
    st.fixed_dictionaries({"tokens": st.lists(_count, max_size=4)}),
    st.fixed_dictionaries({"segments": _json_leaf, "tokens": _json_leaf}),
)
_near_valid = st.builds(
    lambda body, tenant, layout: {"tenant": tenant, **body, **layout},
    _body,
    st.sampled_from(["t", "", 7]),
    st.fixed_dictionaries({}, optional={"layout": st.lists(_chunk, max_size=3) | _json_leaf}),
)
_line = st.one_of(
    st.just(VALID),
    _json.map(json.dumps),
    _near_valid.map(json.dumps),
    st.text(alphabet=string.printable + "é\x00", max_size=40),
)


def _parse_or_name_the_line(lines: list[str]) -> None:
    try:
        trace = parse_lines(lines, "f.jsonl")
    except TraceError as exc:
        text = str(exc)
        assert text.startswith("f.jsonl"), text
        assert "line " in text or text == "f.jsonl: no requests", text
        return
    for request in trace.requests:
        assert request.token_ids().shape == (request.n_tokens,)
        request.chunks()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line.filter(lambda s: "\n" not in s and "\r" not in s), min_size=1, max_size=4))
def test_arbitrary_lines_parse_or_name_the_line(lines: list[str]) -> None:
    _parse_or_name_the_line(lines)


@settings(max_examples=400, deadline=None)
@given(_near_valid)
def test_near_valid_requests_parse_or_name_the_field(doc: dict[str, Any]) -> None:
    _parse_or_name_the_line([json.dumps(doc)])


# -- replay through real vaults ------------------------------------------------------------------------

BLOB = 256 * 1024  # four distinct blocks clear the vault's 1 MiB minimum budget


def _request(tenant: str, *parts: tuple[str, int, str]) -> Request:
    layout, at = [], 0
    for _, n, source in parts:
        layout.append({"tokens": [at, at + n], "source": source})
        at += n
    return Request(tenant, tuple(layout), segments=tuple((s, n) for s, n, _ in parts))


def _replay(trace: Trace, policy: str, fraction: float, tmp_path: Path, **kw: Any) -> tuple[PolicyRun, Any]:
    kw.setdefault("lease_ms", 0)  # a lease may cover a quarter of the budget: one of these few blocks
    s = ReplaySettings(policies=(policy,), capacities=(fraction,), blob_bytes=BLOB, **kw)
    work = prepare(trace, s)
    run = replay_one(work, s, policy, fraction, tmp_path, lambda: None, Deadline(120))
    assert run is not None
    return run, work


def test_second_identical_request_hits_every_full_block_but_the_last(tmp_path: Path) -> None:
    a = _request("t0", ("sys", 32, "axioms"), ("q", 16, "user_turn"))  # 48 tokens: 3 full blocks
    b = _request("t0", ("sys", 32, "axioms"), ("q", 16, "user_turn"), ("more", 20, "user_turn"))  # 4 full
    other = _request("t1", ("sys", 32, "axioms"), ("q", 16, "user_turn"))  # same tokens, other tenant
    run, work = _replay(Trace((a, a, b, other)), "lru", 1.0, tmp_path)
    assert work.distinct == 3 + 1 + 3
    # a: 0 of 3; a again: 2 of 3 (the last block holds the last token, always computed); b: 3 of 4; other: 0
    assert run.tally(ALL).blocks == 3 + 3 + 4 + 3
    assert run.tally(ALL).hits == 0 + 2 + 3 + 0 == run.tally(ALL).possible
    assert run.tally("axioms").hits == 2 + 2 and run.tally("user_turn").hits == 1
    assert run.tally(PROTECTED).hits == 4 and run.tally(IMPORTANT_GROUP).blocks == 8
    assert run.hit_tokens == 5 * 16 and run.prompt_tokens == 48 * 3 + 68
    assert run.evictions == 0 and run.stored_keys == 7 and run.unacked == 0
    assert run.tally(ALL).stored == 3 + 1 + 1 + 3 and run.kept("axioms") is None  # lru sends no classes
    assert run.bytes_written >= 7 * BLOB


def test_priority_lru_keeps_the_system_prompt_that_lru_lets_a_long_document_push_out(tmp_path: Path) -> None:
    sys_prompt = ("agent/axioms", 33, "axioms")  # 2 full blocks, importance 1.0
    first = _request("t0", sys_prompt)
    doc = _request("t0", ("paste", 16 * 6 + 1, "generation"))  # 6 blocks of importance 0.1
    again = _request("t0", sys_prompt)
    trace = Trace((first, doc, again))
    results = {p: _replay(trace, p, 0.6, tmp_path)[0] for p in ("lru", "priority-lru")}
    assert results["lru"].capacity_bytes // (BLOB + 64) == 4  # room for 4 of the 8 distinct blocks
    assert results["lru"].tally("axioms").hits == 0
    assert results["priority-lru"].tally("axioms").hits == 2
    assert results["priority-lru"].tally("axioms").possible == 2


def test_context_policy_keeps_the_system_prompt_from_its_metadata(tmp_path: Path) -> None:
    sys_prompt = ("agent/axioms", 33, "axioms")
    doc = _request("t0", ("paste", 16 * 6 + 1, "generation"))
    trace = Trace((_request("t0", sys_prompt), doc, _request("t0", sys_prompt)))
    run, work = _replay(trace, "context", 0.6, tmp_path, protected_cap=0.5)
    assert work.protected_bytes <= 0.5 * run.capacity_bytes
    assert run.tally("axioms").hits == 2 == run.tally(PROTECTED).possible
    assert run.kept("axioms") == 2 * BLOB and run.kept(PROTECTED) is None
    assert run.as_dict()["groups"]["axioms"]["resident_bytes"] == 2 * BLOB


def test_min_turnover_reaches_the_context_vault_and_keeps_what_is_important(tmp_path: Path) -> None:
    """Memories (importance 0.75, not protected) then four documents in a vault of four blocks: a
    turnover of four events ages the memories out; floored at 100000 events they outrank every document."""
    memories = _request("t0", ("agent/memories", 33, "memories"))
    docs = [_request("t0", (f"paste{i}", 16 * 3 + 1, "generation")) for i in range(4)]
    trace = Trace((memories, *docs, memories))
    kept = {}
    for floor in (0, 100000):
        (tmp_path / str(floor)).mkdir()
        run, _ = _replay(trace, "context", 0.3, tmp_path / str(floor), min_turnover=floor)
        kept[floor] = run.tally("memories")
    assert kept[0].hits == 0 and kept[100000].hits == 2 == kept[100000].possible


# -- the command ---------------------------------------------------------------------------------------

TINY_ARGS = ["--tenants", "1", "--agents", "1", "--sessions", "2", "--turns", "2", "--seed", "5"]
RUN_ARGS = [
    "--policies",
    "lru,priority-lru",
    "--capacities",
    "30%,100%",
    "--blob-bytes",
    "32KiB",
    "--lease-ms",
    "0",
]


def test_command_generates_saves_replays_and_charts(tmp_path: Path) -> None:
    out, saved = tmp_path / "out.json", tmp_path / "trace.jsonl"
    first = bench(
        "trace", *TINY_ARGS, *RUN_ARGS, "--json", str(out), "--write-trace", str(saved), cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr + first.stdout
    doc = json.loads(out.read_text())
    assert doc["mode"] == "trace" and doc["ok"] is True and not doc["truncated"]
    assert [(r["policy"], r["fraction"]) for r in doc["runs"]] == [
        ("lru", 0.3),
        ("priority-lru", 0.3),
        ("lru", 1.0),
        ("priority-lru", 1.0),
    ]
    full = {r["policy"]: r for r in doc["runs"] if r["fraction"] == 1.0}
    ceiling = doc["working_set"]["ceiling"][ALL]
    for run in full.values():  # everything fits: every reusable block hits, nothing is evicted
        assert run["groups"][ALL]["hits"] == ceiling["possible"] > 0 and run["evictions"] == 0
    names = {(t["name"], t["fraction"]) for t in doc["targets"]}
    assert names == {(n, f) for n in ("protected", "important", "overall") for f in (0.3, 1.0)}
    if importlib.util.find_spec("matplotlib") is None:
        assert doc["chart"] is None and any("matplotlib is not installed" in w for w in doc["warnings"])
    else:
        assert doc["chart"] == str(out.with_suffix(".png"))
        assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        "met" in first.stdout
        and "design targets" in first.stdout
        and "hit rates per policy and capacity" in first.stdout
    )
    assert saved.read_text().splitlines()[0].startswith('{"format": "tierkv-trace"')

    again = tmp_path / "again.json"
    args = ["--trace", str(saved), *RUN_ARGS, "--min-turnover", "7", "--json", str(again)]
    replayed = bench("trace", *args, cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr + replayed.stdout
    assert json.loads(again.read_text())["settings"]["replay"]["min_turnover"] == 7
    hits = [[r["groups"][ALL]["hits"] for r in json.loads(p.read_text())["runs"]] for p in (out, again)]
    assert hits[0] == hits[1]


def test_command_names_the_bad_line_of_a_trace(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(VALID + "\n" + '{"tenant": "t", "segments": [["s", "many"]]}\n')
    result = bench("trace", "--trace", str(bad), "--policies", "lru", cwd=tmp_path)
    assert result.returncode == 2
    assert f"{bad} line 2.segments[0]" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_segment_ids_give_int64_ids_within_the_vocabulary() -> None:
    ids = segment_tokens("x", 1000)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 151_936


def test_chart_is_skipped_with_a_note_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = Trace((_request("t0", ("s", 40, "axioms")), _request("t0", ("s", 40, "axioms"))))
    run, work = _replay(trace, "lru", 1.0, tmp_path, block_tokens=8)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    note = write_chart([run], work, tmp_path / "c.png", "t")
    assert note is not None and "pip install 'tierkv[bench]'" in note
    assert not (tmp_path / "c.png").exists()


def _run(policy: str, hit_tokens: int, important: Tally, protected: Tally) -> PolicyRun:
    return PolicyRun(
        policy=policy,
        fraction=0.3,
        capacity_bytes=1000,
        tallies={IMPORTANT_GROUP: important, PROTECTED: protected},
        prompt_tokens=100,
        hit_tokens=hit_tokens,
        bytes_written=0,
        evictions=0,
        evicted_bytes=0,
        stored_keys=0,
        unacked=0,
        seconds=0.0,
        prefill_s_saved=0.0,
    )


def test_targets_judge_against_lru_at_equal_capacity() -> None:
    work = Workload([], 16, 100, distinct=50, protected_distinct=4, prompt_tokens=100)  # protected: 400 bytes
    lru = _run("lru", 50, Tally(100, 40, 90), Tally(10, 5, 10))
    good = _run("context", 48, Tally(100, 60, 90), Tally(10, 10, 10))
    bad = _run("context", 47, Tally(100, 59, 90), Tally(10, 9, 10))
    status = {t.name: t.status for t in targets([lru, good], work, 0.5)}
    assert status == {"protected": "met", "important": "met", "overall": "met"}
    status = {t.name: t.status for t in targets([lru, bad], work, 0.5)}
    assert status == {"protected": "short", "important": "short", "overall": "short"}
    status = {t.name: t.status for t in targets([lru, good], work, 0.3)}  # 400 bytes > 0.3 × 1000
    assert status["protected"] == "n/a"
    near_ceiling = _run("lru", 50, Tally(100, 80, 90), Tally(10, 10, 10))  # 1.5 × 80% > the 90% ceiling
    found = targets([near_ceiling, good], work, 0.5)
    assert [t.status for t in found if t.name == "important"] == ["n/a"]
    assert targets([good], work, 0.5) == []  # no lru at that capacity: nothing to judge against


def test_a_run_out_of_time_says_so_and_fails(tmp_path: Path) -> None:
    s = TraceSettings(
        spec=TraceSpec(seed=1, tenants=1, agents=1, sessions=1, turns=1),
        replay=ReplaySettings(policies=("lru",), capacities=(1.0,), blob_bytes=BLOB, max_seconds=1e-9),
    )
    result = run_trace(s, Console(file=io.StringIO()))
    assert result.truncated and not result.runs and not result.ok
    assert "no run finished within its time limit" in result.errors[0]
    assert result.warnings[0] == "lru @ 100%: stopped at --max-seconds 1e-09; run skipped"


def test_a_budget_too_small_for_the_blocks_is_refused_before_any_vault_starts() -> None:
    s = TraceSettings(
        spec=TraceSpec(seed=1, tenants=1, agents=1, sessions=1, turns=1),
        replay=ReplaySettings(policies=("lru",), capacities=(0.5, 0.0001), blob_bytes=BLOB),
    )
    with pytest.raises(
        BenchError, match=r"capacity 0.01% of the [0-9,]+-byte working set is under [0-9,]+ bytes"
    ):
        run_trace(s, Console(file=io.StringIO()))


def test_puts_no_vault_acknowledged_are_counted() -> None:
    """A vault that is gone makes every lookup a miss; the replay counts the lost puts, never hides them."""
    s = ReplaySettings(policies=("lru",), blob_bytes=4096)
    work = prepare(Trace((_request("t0", ("x", 40, "axioms")),)), s)
    with Cluster({"kv_cold": ["127.0.0.1:1"]}, timeout=2.0) as dead:
        replayer = Replayer(dead, "lru", Blobs(4096), per_batch=8)
        assert replayer.request(work.requests[0]) == 0
    assert replayer.unacked == 2


def test_warnings_keep_their_brackets() -> None:
    """rich would read ``[bench]`` in ``pip install 'tierkv[bench]'`` as markup and drop it."""
    from types import SimpleNamespace

    from rich.console import Console

    from tierkv.bench.render import render_footer

    console = Console(file=io.StringIO(), width=200)
    hint = "chart skipped: matplotlib is not installed (pip install 'tierkv[bench]')"
    render_footer(SimpleNamespace(warnings=[hint], errors=["[x] broke"], ok=True, verdict="ok"), console)  # type: ignore[arg-type]
    text = console.file.getvalue()
    assert hint in text and "[x] broke" in text
