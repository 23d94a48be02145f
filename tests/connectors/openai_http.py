"""An engine's OpenAI-compatible server as a subprocess on loopback, for the server tests of every engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tierkv.vault.launcher import VaultProcess, terminate


def write_config(path: Path, vaults: dict[str, VaultProcess]) -> Path:
    """A tierkv.toml naming one vault per role (``kv_cold``, ``ssm_cold``)."""
    lines = ["[cluster]", 'role = "inference"', "timeout = 2.0"]
    for role, vault in vaults.items():
        host, port = vault.address.rsplit(":", 1)
        lines += [f"[cluster.{role}]", f'host = "{host}"', f"port = {port}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def completion_text(port: int, body: dict[str, Any]) -> str:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return str(json.loads(resp.read())["choices"][0]["text"])


@contextmanager
def running_server(
    cmd: list[str],
    ready_url: str,
    log: Path,
    *,
    env: dict[str, str],
    stop_s: float,
    stop_signal: int = signal.SIGINT,
    start_s: float = 120.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` (with ``env`` over this process's environment), its output appended to ``log``, once
    ``ready_url`` answers; a server that exits or is not up within ``start_s`` fails the test.

    It is stopped with ``stop_signal`` (SIGINT: the server shuts down as on Ctrl-C, so the tier ships
    what is queued), and killed if it is still running ``stop_s`` later.
    """
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, env=os.environ | env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        deadline = time.monotonic() + start_s
        while True:
            try:
                urllib.request.urlopen(ready_url, timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"server did not start (exit {proc.returncode}):\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield proc
    finally:
        terminate(proc, stop_s, stop_signal)
