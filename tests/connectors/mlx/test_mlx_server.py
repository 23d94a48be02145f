"""mlx-lm's OpenAI server started by ``python -m tierkv.connectors.mlx.serve``, over HTTP, with real vaults.

The server keeps one prompt in memory (``--prompt-cache-size 1``): serving B evicts A, which the tiered
prompt cache ships to the vaults; serving A again restores it from there. The answers must be the tokens
a full prefill gives, and the server's log must say the prompt came back from the vaults.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "mlx.core", reason="mlx is not installed here (scripts/setup-mlx-env.sh builds .venv-mlx)"
)

from tests.conftest import VaultFactory
from tests.connectors.mlx.models import as_text, prompt, run, save_model, tiny_model
from tests.connectors.openai_http import completion_text, running_server, write_config
from tests.ports import free_port

pytestmark = pytest.mark.mlx

NEW = 8


class _Server:
    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log

    def complete(self, tokens: list[int]) -> list[int]:
        body = {"prompt": as_text(tokens), "max_tokens": NEW, "temperature": 0.0}
        text = completion_text(self.port, body)
        return [int(w[1:-1]) for w in text.split()]


@pytest.fixture
def server(tmp_path: Path, vault_factory: VaultFactory) -> Iterator[_Server]:
    kv, ssm = vault_factory("kv", role="kv_cold"), vault_factory("ssm", role="ssm_cold")
    model_dir = save_model("llama", tmp_path / "model")
    port = free_port()
    log = tmp_path / "server.log"
    config = write_config(tmp_path / "tierkv.toml", {"kv_cold": kv, "ssm_cold": ssm})
    cmd = [sys.executable, "-m", "tierkv.connectors.mlx.serve", "--tierkv-config"]
    cmd += [str(config), "--model", str(model_dir)]
    cmd += ["--port", str(port), "--prompt-cache-size", "1", "--log-level", "INFO"]
    ready = f"http://127.0.0.1:{port}/v1/models"
    with running_server(cmd, ready, log, env={"PYTHONPATH": "."}, stop_s=15):
        yield _Server(port, log)


def test_evicted_prompt_comes_back_from_the_vault_with_identical_output(server: _Server) -> None:
    a, b = prompt(70, seed=11), prompt(50, seed=12)
    expected = run(tiny_model("llama"), a, new=NEW).tokens
    first = server.complete(a)
    assert first == expected[: len(first)] and first
    server.complete(b)
    assert "blobs stored" in server.log.read_text()
    again = server.complete(a)
    assert again == first
    assert "restored 64 of 70 prompt tokens from the vaults" in server.log.read_text()
