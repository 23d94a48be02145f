"""Shared fixtures: real vault processes on 127.0.0.1 with random free ports and real LMDB directories."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tierkv.vault.launcher import VaultProcess

VaultFactory = Callable[..., VaultProcess]

ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""The math libraries' thread counts, set to one in each parallel test worker (``pytest -n``)."""

# Property tests judge results, never time: Hypothesis' default 200 ms deadline per example and its
# too-slow health check are timings, which a busy machine (tests in parallel, other work) fails.
settings.register_profile("tierkv", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tierkv")


def pytest_configure(config: pytest.Config) -> None:
    """In a parallel worker, torch, OpenMP and BLAS run one thread each (children inherit it).

    The workers already fill the cores; a library that also starts a thread per core makes the machine
    run several times more threads than it has, and OpenMP's spinning barriers then wait for threads that
    are not running (a hybrid model's restore test took 33 s instead of 9 s on two busy cores). Set
    before any test module imports torch; a value already in the environment is kept.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ONE_THREAD:
            os.environ.setdefault(name, "1")


@pytest.fixture(scope="session", autouse=True)
def run_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Give the run a temp dir of its own and remove it at the end.

    vLLM puts its engine IPC sockets and its ``file://`` rendezvous files in the temp dir and leaves them
    there after shutdown (seven per multiprocess engine); they land here instead of in ``/tmp``.
    Subprocesses (vaults, vLLM's engine core) inherit it through ``TMPDIR``.
    """
    path = tmp_path_factory.mktemp("tmp")
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = str(path)
    yield path
    tempfile.tempdir = saved_dir
    if saved_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved_env
    shutil.rmtree(path, ignore_errors=True)


def token_file_args(tmp_path: Path, lines: str) -> list[str]:
    """A vault's ``extra_args`` for a config whose ``[auth]`` names a token file (mode 0600) of ``lines``."""
    tokens = tmp_path / "tokens"
    tokens.write_text(lines)
    tokens.chmod(0o600)
    cfg = tmp_path / "tokens.toml"
    cfg.write_text(f'[auth]\ntoken_file = "{tokens}"\n')
    return ["--config", str(cfg)]


@pytest.fixture
def vault_factory(tmp_path: Path) -> Iterator[VaultFactory]:
    """Start real ``tierkv vault`` processes; every one still running is stopped (by PID) at teardown."""
    started: list[VaultProcess] = []

    def make(name: str = "vault", start: bool = True, **kwargs: Any) -> VaultProcess:
        kwargs.setdefault("max_bytes", "64MiB")
        proc = VaultProcess(tmp_path / name, **kwargs)
        started.append(proc)
        return proc.start() if start else proc

    yield make
    stop_side_by_side(started, timeout=10)


def stop_side_by_side(vaults: Sequence[VaultProcess], timeout: float) -> None:
    """SIGTERM to every vault still running, then wait for each, SIGKILL after ``timeout``: a test's
    vaults shut down side by side, not one after another."""
    running = [v.proc for v in vaults if v.proc is not None and v.proc.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def vault(vault_factory: VaultFactory) -> VaultProcess:
    return vault_factory()
