"""``make demo`` end to end: real vault processes, store, restore, status, clean stop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "tierkv", "demo", "--tokens", "1024", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS: stored 64 KV blocks" in result.stdout
    assert "64/64 blocks present" in result.stdout
    assert "32 of 64 blocks reusable" in result.stdout
    assert result.stdout.count("exited with 0") == 2
    assert (state / "kv_cold" / "data.mdb").exists()
