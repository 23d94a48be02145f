"""``tierkv llama-serve`` over HTTP on loopback, with a real vault: a restarted server restores the prompt.

The first server computes the prompt and ships its blocks (at the latest when it stops); a second server,
a new process with nothing in memory, gets the same request: its answer must be the full eval's, and
its log must say the prompt came back from the vaults.
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
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (make test-llamacpp)")

from tests.conftest import VaultFactory
from tests.connectors.llamacpp.models import make_llm, model_file
from tierkv.client.vault import VaultClient
from tierkv.vault.launcher import VaultProcess

pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(600)]

TEXT = " ".join(f"w{i}" for i in range(3, 23))  # byte tokens mostly: ~120 tokens
NEW = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(path: Path, kv: VaultProcess) -> Path:
    host, port = kv.address.rsplit(":", 1)
    lines = ["[cluster]", 'role = "inference"', "timeout = 2.0", "[cluster.kv_cold]", f'host = "{host}"']
    path.write_text("\n".join([*lines, f"port = {port}"]) + "\n")
    return path


def _complete(port: int) -> str:
    body = {"prompt": TEXT, "max_tokens": NEW, "temperature": 0.0, "seed": 0}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return str(json.loads(resp.read())["choices"][0]["text"])


@contextmanager
def _server(model: Path, config: Path, log: Path) -> Iterator[int]:
    port = _free_port()
    cmd = [sys.executable, "-m", "tierkv", "llama-serve", "--tierkv-config", str(config)]
    cmd += ["--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512"]
    with log.open("ab") as out:
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
        yield port
    finally:
        proc.send_signal(signal.SIGINT)  # uvicorn stops; the tier ships what is queued
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_restarted_server_restores_the_prompt_from_the_vault(
    tmp_path: Path, vault_factory: VaultFactory
) -> None:
    kv = vault_factory("kv", role="kv_cold")
    model = model_file(tmp_path, "tiny")
    config = _config(tmp_path / "tierkv.toml", kv)
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
