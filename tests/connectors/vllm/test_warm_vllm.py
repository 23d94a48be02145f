"""Warm start through real vLLM OpenAI servers: a prompt served by one server (with ``[retention]
warm_tokens``) is snapshotted from the vault after that server is gone; a freshly started server is warmed
with ``tierkv warm``, and the prompt's first use there hits vLLM's own GPU prefix cache — nothing is
loaded from the vault for it any more."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.conftest import VaultFactory
from tests.connectors.vllm.engine import BLOCK_SIZE, prompt, write_tiny_llama
from tests.connectors.vllm.test_server_vllm import MODEL, metric, post, serve, stored
from tests.test_cli import tierkv
from tierkv.warm import load_snapshot

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

BLOCKS = 10


def prefix_cache_hits(base: str) -> float:
    """vLLM's GPU prefix-cache hits (tokens), summed over its engines."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


def complete(base: str, tokens: list[int]) -> None:
    post(f"{base}/v1/completions", {"model": MODEL, "prompt": tokens, "max_tokens": 1, "temperature": 0.0})


def test_snapshot_restart_warm_and_the_first_use_hits_the_gpu_prefix_cache(
    tmp_path: Path, vault_factory: VaultFactory
) -> None:
    vault = vault_factory("kv", max_bytes="256MiB")
    host, port = vault.address.rsplit(":", 1)
    toml = tmp_path / "tierkv.toml"
    cluster = f'[cluster]\ntimeout = 5.0\nkv_cold = {{host = "{host}", port = {port}}}\n'
    toml.write_text(cluster + "[retention]\nwarm_tokens = true\n")
    model = write_tiny_llama(tmp_path / "model")
    system = prompt(11, BLOCKS * BLOCK_SIZE)
    with serve(model, toml, tmp_path / "first.log") as base:
        complete(base, system)
        stored(base)
        complete(base, system)  # restored from the vault: the chain gets its hits
        stored(base)
        assert metric(base, "restored_blocks") >= BLOCKS - 1

    snap = tmp_path / "snap.json"
    result = tierkv("snapshot", "--config", str(toml), "--output", str(snap))
    assert result.returncode == 0, result.stdout + result.stderr
    assert any(list(p.tokens) == system[: len(p.tokens)] for p in load_snapshot(snap).prefixes)

    with serve(model, toml, tmp_path / "second.log") as base:
        result = tierkv("warm", "--engine-api", base, "--snapshot", str(snap))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "warmed" in result.stdout
        restored = metric(base, "restored_blocks")
        assert restored >= BLOCKS - 2, "the warm requests were served from the vault"
        hits = prefix_cache_hits(base)
        complete(base, [*system, 5, 6, 7])  # the first real use of the prompt
        assert prefix_cache_hits(base) - hits >= BLOCKS * BLOCK_SIZE - BLOCK_SIZE
        assert metric(base, "restored_blocks") == restored, "nothing more came from the vault"
