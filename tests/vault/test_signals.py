"""A stop signal stops the vault whichever of its threads the kernel hands it to.

The kernel delivers a process-directed signal to any thread that does not block it — under ``strace`` often
not the main thread, which is then stopped for the tracer. Python runs the handler only in the main thread,
so a main thread asleep in a plain lock wait (which only the signal itself would interrupt) never learns of
it. Here the signal goes to one chosen thread that is not the main one (``tgkill``), every time.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import VaultFactory
from tierkv import VaultClient

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill and /proc are Linux's")
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)


def other_threads(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)


def tgkill(pid: int, tid: int, sig: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


@pytest.mark.skipif(SYS_TGKILL is None, reason="tgkill's syscall number is known for x86_64 and aarch64")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_delivered_to_another_thread_stops_the_vault(
    vault_factory: VaultFactory, sig: signal.Signals
) -> None:
    vault = vault_factory()
    with VaultClient(vault.address) as c:
        c.put(b"ns", {b"k": b"kept"})
    assert vault.proc is not None
    pid = vault.proc.pid
    threads = other_threads(pid)
    assert threads, "a serving vault runs more threads than its main one"
    oldest = threads[0]  # started with the vault; a bulk connection's thread may end under our feet
    tgkill(pid, oldest, sig)
    try:
        assert vault.proc.wait(timeout=20) == 0
    except subprocess.TimeoutExpired:
        pytest.fail(f"{sig.name} to thread {oldest} of vault {pid} did not stop it within 20 s")
    assert "shutting down gracefully" in vault.log_tail()
