"""``tierkv bench mlx`` end to end: vaults started by the bench, a JSON document, every restore checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip(
    "mlx.core", reason="mlx is not installed here (scripts/setup-mlx-env.sh builds .venv-mlx)"
)

pytestmark = pytest.mark.mlx


def test_bench_mlx_runs_through_local_vaults_and_reports_identical_restores() -> None:
    cmd = [sys.executable, "-m", "tierkv", "bench", "mlx", "--tokens", "64,96", "--repeats", "1"]
    cmd += ["--layers", "2", "--hidden", "64", "--sliding-window", "24", "--json", "-"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["ok"] is True  # every restore identical; how fast is the bench's to report, not the test's
    assert [r["tokens"] for r in doc["rows"]] == [64, 96]
    assert all(r["identical"] and r["restored"] == (r["tokens"] - 1) // 16 * 16 for r in doc["rows"])
    assert all(r["fetched_bytes"] > 0 for r in doc["rows"])
    after = {v["role"]: v for v in doc["vaults"]["after"]}
    assert after["kv_cold"]["keys"] > 0 and after["ssm_cold"]["keys"] > 0  # windowed layers: snapshots
    assert after["kv_cold"]["hits"] > 0 and after["ssm_cold"]["hits"] > 0
