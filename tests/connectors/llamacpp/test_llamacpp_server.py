"""``tierkv llama-serve`` over HTTP on loopback, with a real vault: a restarted server restores the prompt.

The first server computes the prompt and ships its blocks (at the latest when it stops); a second server,
a new process with nothing in memory, gets the same request: its answer must be the full eval's, and
its log must say the prompt came back from the vaults.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (make test-llamacpp)")

from tests.conftest import VaultFactory
from tests.connectors.llamacpp.models import make_llm, model_file
from tests.connectors.openai_http import completion_text, running_server, write_config
from tests.ports import free_port
from tierkv.client.vault import VaultClient

pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(600)]

TEXT = " ".join(f"w{i}" for i in range(3, 23))  # byte tokens mostly: ~120 tokens
NEW = 8


def _complete(port: int) -> str:
    return completion_text(port, {"prompt": TEXT, "max_tokens": NEW, "temperature": 0.0, "seed": 0})


@contextmanager
def _server(model: Path, config: Path, log: Path) -> Iterator[int]:
    port = free_port()
    cmd = [sys.executable, "-m", "tierkv", "llama-serve", "--tierkv-config", str(config)]
    cmd += ["--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512"]
    ready = f"http://127.0.0.1:{port}/v1/models"
    with running_server(cmd, ready, log, env={"PYTHONPATH": "."}, stop_s=30):
        yield port


def test_a_restarted_server_restores_the_prompt_from_the_vault(
    tmp_path: Path, vault_factory: VaultFactory
) -> None:
    kv = vault_factory("kv", role="kv_cold")
    model = model_file(tmp_path, "tiny")
    config = write_config(tmp_path / "tierkv.toml", {"kv_cold": kv})
    llm = make_llm(model, flash=False)
    expected = llm.create_completion(TEXT, max_tokens=NEW, temperature=0.0, seed=0)["choices"][0]["text"]
    n = len(llm.tokenize(TEXT.encode()))
    llm.close()
    log = tmp_path / "server.log"
    with _server(model, config, log) as port:
        assert _complete(port) == expected
    with VaultClient(kv.address) as client:
        assert client.stats().keys >= n // 16, "the first server stored every full block of the prompt"
    with _server(model, config, log) as port:
        assert _complete(port) == expected
    assert f"restored {(n - 1) // 16 * 16} of {n} prompt tokens from the vaults" in log.read_text()
