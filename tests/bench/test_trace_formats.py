"""``bench trace`` on the traces users bring: Mooncake's, Alibaba's Bailian, aiperf's and Dynamo's
mooncake-style files, as real files (gzip, byte-order mark, CRLF, blank lines, extra fields, unsorted
timestamps), replayed with hand-computed hits; and the traces that cannot be replayed (token counts only,
text, CSV, Parquet, a truncated gzip), each refused in one line naming the file, the line and the field.

The command runs as a real process where the exit status and the one-line error are what is tested;
the rest calls the reader and the in-process replay directly (the replay through vaults is tested in
test_trace_replay.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.bench.test_synthetic import bench
from tierkv.bench.trace import ReadOptions, TraceError, parse_lines, read_trace
from tierkv.bench.trace.reference import in_process_run, work_stream
from tierkv.bench.trace.replay import ALL, ReplaySettings, prepare

RUN = ("--in-process", "--policies", "lru", "--capacities", "100%")
"""An unbounded LRU: every block seen before hits, so the hits are the hand-computed reuse."""


def _write(path: Path, docs: list[dict[str, Any]], *, newline: str = "\n", bom: bool = False) -> Path:
    text = ("\ufeff" if bom else "") + newline.join(json.dumps(d) for d in docs) + newline
    path.write_bytes(gzip.compress(text.encode()) if path.name.endswith(".gz") else text.encode())
    return path


def _hits(doc: dict[str, Any]) -> tuple[int, int]:
    """Blocks hit and tokens hit of the one run of a ``--json`` document."""
    (run,) = doc["runs"]
    return run["groups"][ALL]["hits"], run["hit_tokens"]


def _replay(trace_path: Path, tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "out.json"
    result = bench("trace", "--trace", str(trace_path), *RUN, *args, "--json", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["stdout"] = result.stdout
    return doc


def _in_process_hits(path: Path, options: ReadOptions | None = None) -> int:
    trace = read_trace(path, options)
    assert trace.block_tokens is not None
    s = ReplaySettings(policies=("lru",), capacities=(1.0,), block_tokens=trace.block_tokens, blob_bytes=4096)
    work = prepare(trace, s)
    return in_process_run(work, work_stream(work), "lru", 1.0, s).tally(ALL).hits


# -- Mooncake (FAST'25 traces, arXiv trace): ms timestamps, 512-token blocks --------------------------------

MOONCAKE = [
    # 3 full blocks and a partial one; lookable 3 (the last token is in block 3): nothing held, stores 0-2
    {"timestamp": 0, "input_length": 1600, "output_length": 52, "hash_ids": [0, 1, 2, 3]},
    # 2 full blocks (the 3rd partial), lookable 2: hits 0, 1
    {"timestamp": 3052, "input_length": 1100, "output_length": 26, "hash_ids": [0, 1, 4]},
    # 4 full blocks, lookable 3 (2047 // 512): hits 0, 1, 2; stores 5
    {"timestamp": 6000, "input_length": 2048, "output_length": 7, "hash_ids": [0, 1, 2, 5]},
]
MOONCAKE_HITS = 0 + 2 + 3


def test_a_mooncake_trace_is_replayed_in_its_512_token_blocks_found_from_its_lines(tmp_path: Path) -> None:
    """Lengths 1600/1100/2048 with 4/3/4 ids fit blocks of 410–533 tokens: 512 and no other power of two."""
    doc = _replay(_write(tmp_path / "conversation_trace.jsonl", MOONCAKE), tmp_path)
    assert _hits(doc) == (MOONCAKE_HITS, MOONCAKE_HITS * 512)
    reading = doc["trace"]["reading"]
    assert reading["block_tokens"] == 512 and reading["block_tokens_from"] == "lines"
    assert reading["timestamp_unit"] == "ms" and reading["order"] == "file"
    assert doc["working_set"]["block_tokens"] == 512
    assert "hash ids of 512-token blocks" in doc["stdout"]
    load = doc["trace"]["load"]
    assert load["peak_rss_bytes"] >= load["peak_rss_after_prepare_bytes"] > 0 and load["us_per_request"] > 0
    assert "µs a request); peak RSS" in doc["stdout"]


def test_gzip_bom_crlf_and_blank_lines_read_as_the_plain_file(tmp_path: Path) -> None:
    """A gzip stream is told by its first bytes, whatever the file is called; the byte-order mark is not
    part of the first line; CRLF and blank lines change nothing."""
    docs: list[dict[str, Any]] = []
    for d in MOONCAKE:
        docs += [d, {}]  # "{}" lines are replaced by blank ones below
    for name in ("toolagent_trace.jsonl.gz", "toolagent_trace.jsonl"):
        text = "\ufeff" + "\r\n".join("" if not d else json.dumps(d) for d in docs) + "\r\n\r\n"
        path = tmp_path / name
        path.write_bytes(gzip.compress(text.encode("utf-8")))
        trace = read_trace(path)
        assert trace.reading["compression"] == "gzip" and len(trace.requests) == 3
        assert _in_process_hits(path) == MOONCAKE_HITS
    plain = _write(tmp_path / "plain.jsonl", MOONCAKE, newline="\r\n", bom=True)
    assert read_trace(plain).reading["compression"] is None
    assert _in_process_hits(plain) == MOONCAKE_HITS


# -- Alibaba Bailian ("KVCache Cache in the Wild"): seconds, 16-token blocks, chat ids ----------------------


def _bailian(chat: int, parent: int, ts: float, length: int, ids: list[int], turn: int = 1) -> dict[str, Any]:
    return {
        "chat_id": chat,
        "parent_chat_id": parent,
        "timestamp": ts,
        "input_length": length,
        "output_length": 8,
        "type": "text",
        "turn": turn,
        "hash_ids": ids,
    }


BAILIAN = [
    _bailian(1, -1, 0.5, 40, [10, 11, 12]),  # 2 full blocks, lookable 2: stores 10, 11
    _bailian(3, -1, 3.0, 64, [10, 11, 13, 14]),  # 4 full blocks, lookable 3 (63 // 16)
    _bailian(2, 1, 2.25, 70, [10, 11, 13, 14, 15], turn=2),  # 4 full blocks, lookable 4
]
# In timestamp order (1, 2, 3): 2 hits 10, 11 and stores 13, 14; 3 hits 10, 11, 13 -> 0 + 2 + 3.
# In the file's order (1, 3, 2): 3 hits 10, 11 and stores 13, 14; 2 hits 10, 11, 13, 14 -> 0 + 2 + 4.
BAILIAN_SORTED, BAILIAN_FILE_ORDER = 5, 6


def test_a_bailian_trace_is_read_in_seconds_and_16_token_blocks_in_timestamp_order(tmp_path: Path) -> None:
    path = _write(tmp_path / "qwen_traceA_blksz_16.jsonl", BAILIAN)
    doc = _replay(path, tmp_path)
    assert _hits(doc) == (BAILIAN_SORTED, BAILIAN_SORTED * 16)
    reading = doc["trace"]["reading"]
    assert reading["block_tokens"] == 16 and reading["timestamp_unit"] == "s"
    assert reading["order"] == "timestamp" and reading["out_of_order"] == 1
    assert reading["ignored_fields"] == []  # chat_id, parent_chat_id, type, turn are Bailian's own
    assert "timestamps read as seconds" in doc["stdout"] and "replayed in timestamp order" in doc["stdout"]
    trace = read_trace(path)
    assert [r.timestamp for r in trace.requests] == [500.0, 2250.0, 3000.0]  # milliseconds


def test_keep_order_replays_the_file_order(tmp_path: Path) -> None:
    path = _write(tmp_path / "qwen.jsonl", BAILIAN)
    assert _in_process_hits(path) == BAILIAN_SORTED
    assert _in_process_hits(path, ReadOptions(keep_order=True)) == BAILIAN_FILE_ORDER
    ms = read_trace(path, ReadOptions(time_unit="ms"))
    assert sorted(r.timestamp or 0 for r in ms.requests) == [0.5, 2.25, 3.0]


# -- aiperf / Dynamo mooncake-style traces: float ms, sessions, extra fields, 64-bit ids --------------------


def test_extra_fields_are_ignored_and_named_and_64_bit_ids_stay_distinct(tmp_path: Path) -> None:
    big, negative = 2**64 - 1, -(2**63)
    docs = [
        {"session_id": "s1", "timestamp": 10.25, "input_length": 1100, "hash_ids": [big, 1, 2], "x_gpu": 3},
        {"session_id": "s1", "delay": 500, "input_length": 1100, "hash_ids": [big, 1, 3], "priority": "HIGH"},
        {"timestamp": 20.5, "input_length": 1100, "hash_ids": [negative, 1, 4], "extra": {"top_p": 1}},
    ]
    path = _write(tmp_path / "aiperf.jsonl", docs)
    trace = read_trace(path)
    assert trace.reading["ignored_fields"] == ["x_gpu"] and trace.block_tokens == 512
    assert [r.session for r in trace.requests] == ["s1", "s1", ""]
    assert any("x_gpu" in n for n in trace.notes) and not any("priority" in n for n in trace.notes)
    assert any("1 of 3 requests lack a timestamp" in n for n in trace.notes)
    assert trace.reading["order"] == "file"  # one request has no time: the file's order stands
    # lookable 2 each: request 2 hits big, 1; request 3 starts with another id and hits nothing
    assert _in_process_hits(path) == 2


# -- the block size ------------------------------------------------------------------------------------------


def test_a_16_token_trace_replayed_as_512_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "qwen.jsonl", BAILIAN)
    result = bench("trace", "--trace", str(path), *RUN, "--trace-block-tokens", "512", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{path} line 1.hash_ids: 3 ids for input_length 40 in blocks of 512 tokens" in lines[0]
    assert "is the trace's block size 512?" in lines[0]


def test_a_line_that_fits_no_block_size_of_the_lines_before_it_is_named() -> None:
    lines = [json.dumps(d) for d in (*MOONCAKE, BAILIAN[0])]
    with pytest.raises(
        TraceError, match=r"^t.jsonl line 4.hash_ids: 3 ids for input_length 40 fit blocks of"
    ):
        parse_lines(lines, "t.jsonl")


def test_a_size_the_prompts_do_not_pin_down_is_said_and_can_be_given() -> None:
    short = [
        json.dumps({"input_length": 300, "hash_ids": [1]}),
        json.dumps({"input_length": 500, "hash_ids": [1]}),
    ]
    trace = parse_lines(short, "t.jsonl")  # 1 id for 500 tokens: any block of 251 tokens or more
    assert trace.block_tokens == 512 and trace.reading["block_tokens_from"] == "assumed"
    assert any("assumed 512" in n and "256, 512, 1024" in n for n in trace.notes)
    assert parse_lines(short, "t.jsonl", ReadOptions(block_tokens=256)).block_tokens == 256
    odd = [json.dumps({"input_length": 1000, "hash_ids": list(range(10))})]  # 91–111 tokens a block
    with pytest.raises(TraceError, match=r"^t.jsonl: .* 91–111 tokens, no power of two"):
        parse_lines(odd, "t.jsonl")
    assert parse_lines(odd, "t.jsonl", ReadOptions(block_tokens=100)).block_tokens == 100


# -- a cap on requests, and what cannot be replayed ------------------------------------------------------


def test_max_requests_stops_reading_at_the_cap(tmp_path: Path) -> None:
    """The lines after the cap are not read: the broken one at the end does not stop a capped run."""
    path = tmp_path / "big.jsonl"
    extra = {"timestamp": 9000, "input_length": 600, "hash_ids": [7, 8]}
    path.write_text("\n".join(json.dumps(d) for d in (*MOONCAKE, extra)) + "\n{broken\n")
    with pytest.raises(TraceError, match="line 5: not a JSON value"):
        read_trace(path)
    doc = _replay(path, tmp_path, "--max-requests", "3")
    assert doc["trace"]["requests"] == 3 and doc["trace"]["reading"]["capped"] is True
    assert _hits(doc) == (MOONCAKE_HITS, MOONCAKE_HITS * 512)
    assert "first 3 requests (--max-requests); more follow" in doc["stdout"]
    assert read_trace(path, ReadOptions(max_requests=4)).reading["capped"] is True  # line 5 is there
    whole = tmp_path / "whole.jsonl"
    whole.write_text("\n".join(json.dumps(d) for d in MOONCAKE) + "\n\n")
    assert read_trace(whole, ReadOptions(max_requests=3)).reading["capped"] is False


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (AZURE.encode(), "line 1: a CSV of token counts (columns TIMESTAMP, ContextTokens, GeneratedTokens)"),
        (BURSTGPT.encode(), "line 1: a CSV of token counts (columns Timestamp, Model, Request tokens"),
        (
            b'{"timestamp": 0, "input_length": 512, "output_length": 9}\n',
            "line 1.hash_ids: missing: a request of",
        ),
        (b'{"text_input": "hi", "output_length": 9}\n', "line 1.text_input: a prompt given as text"),
        (b'{"messages": [{"role": "user"}]}\n', "line 1.messages: a prompt given as text"),
        (
            b'{"input_length": 512, "hash_ids": ["1f3a"]}\n',
            "line 1.hash_ids[0]: expected a 64-bit integer id",
        ),
        (b'{"input_length": 512, "hash_ids": [18446744073709551616]}\n', "line 1.hash_ids[0]: expected a 64"),
        (
            b'{"input_length": 5, "hash_ids": [1], "timestamp": NaN}\n',
            "line 1.timestamp: expected milliseconds",
        ),
        (b'{"input_length": 0, "hash_ids": [1]}\n', "line 1.hash_ids: 1 ids for input_length 0"),
        (b'{"input_length": 5, "hash_ids": [1]}\n\xff\xfe{}\n', "line 2: not UTF-8 text"),
        (b"PAR1\x15\x04", "a Parquet file: convert it to JSONL"),
        pytest.param(  # mtime=0: the same bytes, so the same test id, in every collecting process
            gzip.compress(b'{"input_length": 5, "hash_ids": [1]}\n' * 400, mtime=0)[:-30],
            "unreadable",
            id="a truncated gzip",
        ),
    ],
)
def test_what_cannot_be_replayed_is_refused_in_one_line(content: bytes, message: str, tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    assert str(caught.value).startswith(str(path)) and message in str(caught.value), caught.value


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (AZURE, "line 1: a CSV of token counts"),
        ('{"input_length": 512, "output_length": 9}\n', "line 1.hash_ids: missing"),
        ("", "no requests"),
    ],
)
def test_the_command_refuses_in_one_line_with_exit_2(content: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(content)
    result = bench("trace", "--trace", str(path), *RUN, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"{path}" in line and message in line, line


def test_a_truncated_gzip_names_the_line_it_stopped_at(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps(d) + "\n" for d in MOONCAKE * 300).encode())[:-40])
    with pytest.raises(TraceError, match=r"t.jsonl.gz line \d+: unreadable"):
        read_trace(path)


@pytest.mark.parametrize("packed", [False, True])
def test_a_line_longer_than_any_request_s_is_refused_before_it_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packed: bool
) -> None:
    """A file with no line breaks, or a gzip stream that inflates to one, is not read into memory whole (the
    cap lowered here so that the test writes kilobytes, not the 64 MiB it is)."""
    from tierkv.bench.trace import reader

    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 1000)
    first = json.dumps(MOONCAKE[0]) + "\n"
    body = (first + "[" + "1," * 600 + "1]\n").encode()
    path = tmp_path / ("t.jsonl.gz" if packed else "t.jsonl")
    path.write_bytes(gzip.compress(body, mtime=0) if packed else body)
    with pytest.raises(TraceError, match=r"line 2: longer than 0 MiB"):
        read_trace(path)


def test_the_flags_are_checked() -> None:
    from tierkv.bench.trace.cli_args import parse_block_tokens
    from tierkv.errors import BenchError

    assert parse_block_tokens("auto") is None and parse_block_tokens("16") == 16
    for bad in ("0", "x", "70000"):
        with pytest.raises(BenchError, match="--trace-block-tokens"):
            parse_block_tokens(bad)
    with pytest.raises(BenchError, match="--timestamp-unit"):
        ReadOptions(time_unit="minutes")
    with pytest.raises(BenchError, match="--max-requests"):
        ReadOptions(max_requests=0)


_id = st.integers(-(2**63), 2**64 - 1) | st.text(max_size=3) | st.none() | st.floats()
_hash_doc = st.fixed_dictionaries(
    {"hash_ids": st.lists(_id, max_size=6) | st.none()},
    optional={
        "input_length": st.integers(-2, 4000) | st.text(max_size=2),
        "timestamp": st.floats(allow_nan=True) | st.integers(-5, 2**70) | st.text(max_size=2),
        "chat_id": st.integers(),
        "parent_chat_id": st.integers(),
        "tenant": st.text(max_size=3) | st.integers(),
        "session_id": st.text(max_size=3) | st.integers() | st.lists(st.integers(), max_size=2),
        "zz": st.integers(),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_hash_doc, min_size=1, max_size=4), st.sampled_from([None, 16, 512]))
def test_arbitrary_hash_id_lines_parse_or_name_the_file_and_line(
    docs: list[dict[str, Any]], bt: int | None
) -> None:
    try:
        trace = parse_lines([json.dumps(d) for d in docs], "f.jsonl", ReadOptions(block_tokens=bt))
    except TraceError as exc:
        text = str(exc)
        assert text.startswith("f.jsonl line ") or text.startswith("f.jsonl: "), text
        return
    size = trace.block_tokens
    assert size is not None
    for r in trace.requests:
        n = len(r.hash_ids or ())
        assert r.length // size <= n <= -(-r.length // size)


def test_tenants_never_share_a_block_though_their_ids_are_equal() -> None:
    """Keys are memoized per id within a tenant's namespace, never across namespaces."""
    lines = [json.dumps({"tenant": t, "input_length": 1100, "hash_ids": [0, 1, 2]}) for t in ("a", "b", "a")]
    trace = parse_lines(lines, "t.jsonl")
    work = prepare(trace, ReplaySettings(policies=("lru",), block_tokens=512, blob_bytes=4096))
    a, b, again = work.requests
    assert not set(a.keys) & set(b.keys) and again.keys == a.keys
    assert [r.ceiling for r in work.requests] == [0, 0, 2] and work.distinct == 4


def test_an_untagged_request_sends_the_metadata_a_layout_less_prompt_always_had() -> None:
    """Built when asked for, not held: each block untagged, with the key before it as its parent."""
    from tierkv.retention import tag_blocks, with_parents

    trace = parse_lines([json.dumps({"input_length": 2048, "hash_ids": [0, 1, 2, 3]})], "t.jsonl")
    (r,) = prepare(trace, ReplaySettings(policies=("lru",), block_tokens=512, blob_bytes=4096)).requests
    assert r.tags is None and not r.tagged and len(r.keys) == 4
    assert r.metas == with_parents(tag_blocks([], 4, 512), r.keys)
    assert [m.parent for m in r.metas] == [b"", *r.keys[:3]]
