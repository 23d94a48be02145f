"""``benchmarks/bulk_read.py`` end to end on loopback: two builds (here the same tree twice), each with
its own vault and client process, every contender timed per repetition with both ends' CPU time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.bulk_read import process_cpu

pytestmark = pytest.mark.slow


def test_process_cpu_counts_the_threads_besides_the_main_one() -> None:
    """Also one that has ended by the time it is asked (its schedstat is gone with it)."""
    before = process_cpu(os.getpid())
    worker = threading.Thread(target=lambda: sum(range(6_000_000)))  # the main thread waits meanwhile
    worker.start()
    worker.join(30)
    time.sleep(0.05)  # the ended thread leaves /proc/PID/task
    spent = process_cpu(os.getpid()) - before
    assert spent > 0.02, f"{spent * 1e3:.2f} ms counted for a thread that ran for about 100 ms"


def test_a_loopback_run_times_both_builds_and_both_ends(tmp_path: Path) -> None:
    out = tmp_path / "bulk_read.json"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bulk_read", "--old", str(root), "--new", str(root),
         "--round-mib", "1", "--blob-kib", "256", "--restore-blocks", "8", "--repeats", "2",
         "--json", str(out)],
        cwd=root, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["link"] == "loopback"
    get = doc["get_256k"]
    assert get["bytes"] == 1 << 20
    for name in ("new", "old", "tcp", "tcp_round"):
        assert len(get["runs"][name]) == 2 and get[name]["gbps"] > 0
        assert get[name]["client_cpu_ms"] > 0
    for name in ("new", "old"):  # the vault's CPU is its own process's, read by PID
        assert get[name]["vault_cpu_ms"] > 0
    assert get["new_vs_old"]["min"] <= get["new_vs_old"]["median"] <= get["new_vs_old"]["max"]
    restore = doc["restore"]
    assert restore["bytes"] == 8 * 192 * 1024
    assert len(restore["runs"]["new"]) == 2 and restore["old"]["rate_vs_old"]["median"] == 1.0
