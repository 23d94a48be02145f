"""mlx-lm's OpenAI server started by ``python -m tierkv.connectors.mlx.serve``, over HTTP, with real vaults.

The server keeps one prompt in memory (``--prompt-cache-size 1``): serving B evicts A, which the tiered
prompt cache ships to the vaults; serving A again restores it from there. The answers must be the tokens
a full prefill gives, and the server's log must say the prompt came back from the vaults.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "mlx.core", reason="mlx is not installed here (scripts/setup-mlx-env.sh builds .venv-mlx)"
)

from tests.conftest import VaultFactory
from tests.connectors.mlx.models import as_text, prompt, run, save_model, tiny_model
from tierkv.vault.launcher import VaultProcess

pytestmark = pytest.mark.mlx

NEW = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(path: Path, kv: VaultProcess, ssm: VaultProcess) -> Path:
    lines = ["[cluster]", 'role = "inference"', "timeout = 2.0"]
    for role, vault in (("kv_cold", kv), ("ssm_cold", ssm)):
        host, port = vault.address.rsplit(":", 1)
        lines += [f"[cluster.{role}]", f'host = "{host}"', f"port = {port}"]
    path.write_text("\n".join(lines) + "\n")
    return path


class _Server:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log

    def complete(self, tokens: list[int]) -> list[int]:
        body = {"prompt": as_text(tokens), "max_tokens": NEW, "temperature": 0.0}
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            text = json.loads(resp.read())["choices"][0]["text"]
        return [int(w[1:-1]) for w in text.split()]


@pytest.fixture
def server(tmp_path: Path, vault_factory: VaultFactory) -> Iterator[_Server]:
    kv, ssm = vault_factory("kv", role="kv_cold"), vault_factory("ssm", role="ssm_cold")
    model_dir = save_model("llama", tmp_path / "model")
    port = _free_port()
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "tierkv.connectors.mlx.serve", "--tierkv-config"]
    cmd += [str(_config(tmp_path / "tierkv.toml", kv, ssm)), "--model", str(model_dir)]
    cmd += ["--port", str(port), "--prompt-cache-size", "1", "--log-level", "INFO"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONPATH": "."}
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"server did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield _Server(proc, port, log)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
