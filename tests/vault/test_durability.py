"""Durability of acknowledged Puts: a kill -9 loses nothing, and durable mode really syncs to disk.

A kill -9 leaves the written pages in the OS page cache, so the kill test alone cannot notice a missing
fsync. The sync test runs a real vault under ``strace`` and counts its fsync/fdatasync/msync calls: durable
mode must sync at least once per acknowledged Put, fast mode must not.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import VaultFactory
from tierkv import VaultClient
from tierkv.vault.files import LOCK_FILE
from tierkv.vault.launcher import VaultProcess

SYNC_CALLS = ("fsync", "fdatasync", "msync")
PUTS = 30


def test_kill_minus_nine_loses_nothing_acknowledged(vault_factory: VaultFactory) -> None:
    v = vault_factory(sync="durable")
    blobs = {f"k{i}".encode(): os.urandom(50_000) for i in range(40)}
    with VaultClient(v.address) as c:
        assert c.put(b"ns", blobs) == 40
    v.kill()
    again = vault_factory(name=v.path.name)
    with VaultClient(again.address) as c:
        assert c.get(b"ns", list(blobs)) == list(blobs.values())
        assert c.stats().keys == 40


def _require_strace(tmp_path: Path) -> str:
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (scripts/setup-test-tools.sh installs it)")
    probe = subprocess.run([strace, "-f", "-o", str(tmp_path / "probe"), "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here (ptrace refused?): {probe.stderr.decode().strip()}")
    return strace


def _sync_calls(strace: str, vault: VaultProcess, summary: Path) -> int:
    """Start ``vault`` under strace, acknowledge ``PUTS`` single-entry Puts, kill it; its sync calls."""
    vault.args = [
        strace,
        "-f",
        "-qq",
        "-c",
        "-o",
        str(summary),
        "-e",
        f"trace={','.join(SYNC_CALLS)}",
        *vault.args,
    ]
    vault.start(timeout=60)
    assert vault.proc is not None
    with VaultClient(vault.address, timeout=30) as c:
        for i in range(PUTS):
            assert c.put(b"ns", {f"k{i}".encode(): os.urandom(20_000)}) == 1
    # SIGKILL the vault (not strace, whose PID the launcher has): strace then writes its summary of what the
    # vault did up to here. A serving vault's PID is in its directory's lock file.
    os.kill(int((vault.path / LOCK_FILE).read_text()), signal.SIGKILL)
    vault.proc.wait(60)
    counts = {
        m.group(2): int(m.group(1))
        for m in re.finditer(
            r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", summary.read_text(), re.M
        )
    }
    return sum(counts.get(name, 0) for name in SYNC_CALLS)


def test_durable_mode_syncs_every_acknowledged_put_and_fast_mode_does_not(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    strace = _require_strace(tmp_path)
    durable = _sync_calls(
        strace, vault_factory(name="durable", sync="durable", start=False), tmp_path / "d.txt"
    )
    fast = _sync_calls(
        strace,
        vault_factory(
            name="fast", sync="fast", start=False, extra_args=["-c", str(_slow_sync_config(tmp_path))]
        ),
        tmp_path / "f.txt",
    )
    assert durable >= PUTS, f"durable mode: {durable} sync calls for {PUTS} acknowledged Puts"
    assert fast < PUTS // 3, f"fast mode: {fast} sync calls for {PUTS} Puts (it syncs on a timer)"


def _slow_sync_config(tmp_path: Path) -> Path:
    """Fast mode with a timer long enough that the Puts above see no timed sync."""
    config = tmp_path / "slow-sync.toml"
    config.write_text("[vault]\nsync_interval_s = 600\n")
    return config
