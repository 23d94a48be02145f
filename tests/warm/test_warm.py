"""``tierkv snapshot`` and ``tierkv warm`` end to end on a real vault: the snapshot holds the hottest
replayable prefixes with their token ids; ``warm`` sends each as a one-token completion (to a recording
HTTP server standing in for the engine here; tests/connectors/vllm/test_warm_vllm.py replays into real
vLLM); a malformed snapshot is a clean error (exit 2)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ports import refusing_port
from tests.test_cli import assert_clean_error, tierkv
from tierkv.client import VaultClient
from tierkv.client.fanout import Answer, Target
from tierkv.errors import VaultError
from tierkv.records import HotChain
from tierkv.retention import BlockMeta, keyed
from tierkv.vault.launcher import VaultProcess
from tierkv.warm import SnapshotError, load_snapshot
from tierkv.warm.snapshot import merge

BS = 4


def store_chain(
    c: VaultClient, namespace: bytes, name: bytes, tokens: list[int], *, ids: bool = True
) -> list[bytes]:
    keys = [name + b"%d" % i for i in range(len(tokens) // BS)]
    metas = [BlockMeta(tokens=tuple(tokens[i * BS : (i + 1) * BS]) if ids else ()) for i in range(len(keys))]
    c.put(namespace, {k: b"kv" + k for k in keys}, meta=keyed(metas, keys))
    return keys


class Engine(ThreadingHTTPServer):
    """Records the completions it is sent; answers like an OpenAI server (one model)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Engine

    def _answer(self, doc: object, code: int = 200) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer({"data": [{"id": "tiny"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        if max(body["prompt"]) >= 1000:
            self._answer({"error": "token id out of vocabulary"}, 400)
        else:
            self._answer({"choices": [{"text": "x"}]})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[Engine]:
    server = Engine()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_snapshot_then_warm_replays_the_hottest_prefixes(
    vault: VaultProcess, tmp_path: Path, engine: Engine
) -> None:
    toml = tmp_path / "tierkv.toml"
    host, port = vault.address.rsplit(":", 1)
    toml.write_text(f'[cluster]\nkv_cold = {{host = "{host}", port = {port}}}\n')
    with VaultClient(vault.address) as c:
        hot = store_chain(c, b"ns-a", b"h", list(range(8)))
        store_chain(c, b"ns-a", b"c", list(range(50, 54)))
        no_ids = store_chain(c, b"ns-b", b"n", list(range(8)), ids=False)
        far = store_chain(c, b"ns-b", b"f", [1000, 1, 2, 3])
        for _ in range(3):
            c.get(b"ns-a", hot)
        c.get(b"ns-b", no_ids)
        c.get(b"ns-b", far)
    snap_file = tmp_path / "snap.json"
    result = tierkv("snapshot", "--config", str(toml), "--output", str(snap_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 hot chains without token ids skipped" in result.stdout
    snap = load_snapshot(snap_file)
    assert [(p.namespace, p.tokens) for p in snap.prefixes] == [
        (b"ns-a", tuple(range(8))),
        (b"ns-b", (1000, 1, 2, 3)),
        (b"ns-a", tuple(range(50, 54))),
    ]
    assert snap.prefixes[0].hits == 3 and snap.prefixes[0].blocks == 2

    result = tierkv("warm", "--engine-api", engine.url, "--snapshot", str(snap_file))
    assert result.returncode == 1  # the out-of-vocabulary prefix failed, and says so
    assert "warmed 2 of 3 prefixes" in result.stdout and "HTTP 400" in result.stdout
    assert [b["prompt"] for b in engine.bodies] == [list(p.tokens) for p in snap.prefixes]
    assert all(b["max_tokens"] == 1 and b["model"] == "tiny" for b in engine.bodies)


def test_merge_counts_a_chain_replicas_hold_once_with_its_highest_hits_and_keeps_limit_per_namespace() -> (
    None
):
    def chain(name: bytes, hits: float, tokens: tuple[int, ...] = (1, 2)) -> HotChain:
        return HotChain((name,), hits, "", tokens)

    a, b, down = (Target("kv_cold", f"127.0.0.1:{p}") for p in (1, 2, 3))
    answers = [
        Answer(
            a,
            [("t", b"x", chain(b"k1", 1.0)), ("t", b"x", chain(b"k2", 2.0)), ("t", b"y", chain(b"k3", 0.5))],
        ),
        Answer(
            b,
            [
                ("t", b"x", chain(b"k1", 5.0)),
                ("t", b"x", chain(b"k4", 9.0, ())),
                ("u", b"x", chain(b"k1", 1)),
            ],
        ),
        Answer(down, error=VaultError("unavailable", address=down.address)),
    ]
    snap = merge(answers, limit=2)
    assert [(p.tenant, p.namespace, p.hits) for p in snap.prefixes] == [
        ("t", b"x", 5.0),  # k1: the replica that saw more hits
        ("t", b"x", 2.0),
        ("u", b"x", 1.0),  # another tenant's namespace of the same name is its own
        ("t", b"y", 0.5),
    ]
    assert snap.skipped == 1 and len(snap.errors) == 1 and down.address in snap.errors[0]
    assert [p.hits for p in merge(answers, limit=1).prefixes] == [5.0, 1.0, 0.5]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("not json", "not a readable JSON file"),
        ('{"format": "other"}', "not a tierkv snapshot"),
        ('{"format": "tierkv-snapshot", "version": 9, "prefixes": []}', "version 9"),
        ('{"format": "tierkv-snapshot", "version": 1, "prefixes": [{"tenant": "t"}]}', "prefixes[0].source"),
    ],
)
def test_a_malformed_snapshot_is_a_clean_error(tmp_path: Path, content: str, needle: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    result = tierkv("warm", "--engine-api", "http://127.0.0.1:9", "--snapshot", str(bad))
    assert_clean_error(result, "snapshot error", needle)


ENTRY = {"tenant": "t", "namespace": "6e73", "hits": 1.0, "source": "", "blocks": 1, "tokens": [1, 2]}


@pytest.mark.parametrize(
    "change",
    [
        {"tokens": []},
        {"tokens": [-1]},
        {"tokens": [2**31]},
        {"tokens": [True]},
        {"tokens": [1.5]},
        {"namespace": "zz"},
        {"namespace": "00" * 256},
        {"hits": -1},
        {"hits": float("nan")},
        {"blocks": "1"},
    ],
)
def test_each_bad_field_is_named(tmp_path: Path, change: dict[str, Any]) -> None:
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps({"format": "tierkv-snapshot", "version": 1, "prefixes": [ENTRY, {**ENTRY, **change}]})
    )
    with pytest.raises(SnapshotError, match=r"prefixes\[1\]"):
        load_snapshot(path)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(ENTRY)),
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text(max_size=4)
        | st.lists(st.integers()),
    )
)
def test_any_entry_either_loads_or_is_a_snapshot_error(
    tmp_path_factory: pytest.TempPathFactory, change: dict[str, Any]
) -> None:
    path = tmp_path_factory.mktemp("snap") / "s.json"
    doc = {"format": "tierkv-snapshot", "version": 1, "prefixes": [{**ENTRY, **change}]}
    path.write_text(json.dumps(doc))
    try:
        (p,) = load_snapshot(path).prefixes
    except SnapshotError as exc:
        assert str(path) in str(exc)
    else:
        assert p.tokens and all(isinstance(t, int) and t >= 0 for t in p.tokens)


def test_an_empty_snapshot_says_why(vault: VaultProcess, tmp_path: Path) -> None:
    result = tierkv("snapshot", "--vault", vault.address, "--output", str(tmp_path / "s.json"))
    assert result.returncode == 0, result.stderr
    assert "0 prefixes" in result.stdout and "[retention] warm_tokens = true" in result.stdout


def test_a_vault_that_does_not_answer_leaves_the_last_snapshot_alone(tmp_path: Path) -> None:
    """Not an empty file in its place, and no advice about warm_tokens: the vault was not asked."""
    last = tmp_path / "s.json"
    last.write_text("the last good snapshot")
    with refusing_port() as port:
        result = tierkv("snapshot", "--vault", f"127.0.0.1:{port}", "--output", str(last))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"127.0.0.1:{port}" in output and f"nothing written to {last}" in output, output
    assert "warm_tokens" not in output and "Traceback" not in output, output
    assert last.read_text() == "the last good snapshot"
