"""Mooncake Store beside tierkv in ``benchmarks/links.py``: its master and a RAM segment on the vault side,
a client on the engine side (:mod:`benchmarks.mooncake_peer`, under ``.venv-mooncake``).

Mooncake's transfer engine is a C++ library with its own threads, so each role runs in a process of its own
and the client is driven a command a line from here; the parent times each call the same way it times
tierkv's and Redis's (the pipe adds tens of microseconds to calls of milliseconds).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks.processes import free_port, started

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv-mooncake" / "bin" / "python"
PEER = Path(__file__).with_name("mooncake_peer.py")
FIXED_PORTS = (50051, 8080, 9003)
"""Master RPC, HTTP metadata and metrics: Mooncake's defaults."""


class MooncakeError(RuntimeError):
    """Mooncake answered an error, or one of its processes did not start."""


def available(python: Path = PYTHON) -> bool:
    return python.exists() and (python.parent / "mooncake_master").exists()


def _wait_listening(host: str, port: int, proc: subprocess.Popen[str], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise MooncakeError(f"mooncake_master exited ({proc.returncode}) before it listened")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise MooncakeError(f"mooncake_master did not listen on {host}:{port} within {seconds:g} s")


def _ready(proc: subprocess.Popen[str], what: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        raise MooncakeError(f"{what}: {line or 'exited before it was ready'}")


class MooncakeClient:
    """The engine side's client process, one command a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._proc = proc

    def call(self, verb: str, size: int = 0, n: int = 0) -> None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(f"{verb} {size} {n}\n" if size else f"{verb}\n")
        self._proc.stdin.flush()
        reply = self._proc.stdout.readline().strip()
        if reply != "ok":
            raise MooncakeError(f"{verb} {size} {n}: {reply or 'the client exited'}")


@contextlib.contextmanager
def mooncake_store(
    vault_host: str,
    engine_host: str,
    vault_prefix: Sequence[str],
    segment_mib: int = 1536,
    python: Path = PYTHON,
) -> Iterator[MooncakeClient]:
    """Master and segment started with ``vault_prefix`` on ``vault_host``; the client in the caller's own
    network namespace (enter the engine side first) on ``engine_host``."""
    # In a namespace of the link's own the well-known ports are free; on loopback, take free ones.
    ports = FIXED_PORTS if vault_prefix else tuple(free_port(vault_host) for _ in FIXED_PORTS)
    master_port, metadata_port, metrics_port = ports
    metadata = f"http://{vault_host}:{metadata_port}/metadata"
    master = f"{vault_host}:{master_port}"
    master_args = [
        str(python.parent / "mooncake_master"),
        f"--rpc_address={vault_host}",
        f"--rpc_port={master_port}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={vault_host}",
        f"--http_metadata_server_port={metadata_port}",
        f"--metrics_port={metrics_port}",
    ]
    with contextlib.ExitStack() as stack:
        proc = stack.enter_context(started([*vault_prefix, *master_args], stdin=False))
        _wait_listening(vault_host, metadata_port, proc)
        server = [str(python), str(PEER), "server", vault_host, metadata, master, str(segment_mib)]
        _ready(stack.enter_context(started([*vault_prefix, *server], stdin=True)), "Mooncake segment")
        client = stack.enter_context(
            started([str(python), str(PEER), "client", engine_host, metadata, master], stdin=True)
        )
        _ready(client, "Mooncake client")
        yield MooncakeClient(client)
