"""Pausing vault processes that a test started (by PID), for tests of hung vaults."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tierkv.vault.launcher import VaultProcess


@contextmanager
def stopped(*vaults: VaultProcess) -> Iterator[None]:
    """SIGSTOP the vault processes started here (by PID): they accept connections but never answer.

    Waits until every thread is stopped: a thread in uninterruptible sleep (an fsync) delays the stop of
    the whole process, and meanwhile the others would still answer."""
    pids = []
    for v in vaults:
        assert v.proc is not None
        pids.append(v.proc.pid)
        os.kill(v.proc.pid, signal.SIGSTOP)
    try:
        for pid in pids:
            wait_until_stopped(pid)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # killed while stopped, by the test
                os.kill(pid, signal.SIGCONT)


def wait_until_stopped(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    tasks = Path(f"/proc/{pid}/task")
    while time.monotonic() < deadline:
        states = set()
        for task in tasks.iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                states.add((task / "stat").read_text().rsplit(") ", 1)[1][:1])
        if states <= {"T", "t"}:
            return
        time.sleep(0.01)
    pytest.fail(f"vault {pid} did not stop within {timeout} s")
