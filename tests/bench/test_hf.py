"""``tierkv bench --hf`` with a tiny random-weight model: prefill, hot hit and cold restore really happen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")


@pytest.mark.slow
def test_hf_bench_restores_from_the_vaults_and_reports_ttft(tmp_path: Path) -> None:
    out = tmp_path / "hf.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "tierkv", "bench", "--hf", "--shape", "custom:2,2,32,float32",
            "--tokens", "64,160", "--repeats", "1", "--codec", "int8", "--json", str(out),
        ],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert doc["mode"] == "hf" and doc["ok"] and doc["errors"] == []
    assert doc["settings"]["architecture"]["family"] == "llama"
    assert doc["settings"]["codec"] == "int8"
    assert "torch" in doc["versions"] and "transformers" in doc["versions"]
    rows = {r["tokens"]: r for r in doc["results"]}
    assert set(rows) == {64, 160}
    for n, row in rows.items():
        # everything but the last prompt token's block comes back from the vaults
        assert row["restore_sources"] == ["cold"] and row["hot_sources"] == ["hot"]
        assert row["restored_tokens"] == (n - 1) // 16 * 16
        assert row["bytes_fetched"] > 0
        for name in ("prefill_ttft_s", "hot_ttft_s", "restore_ttft_s", "prefill_tokens_per_s", "speedup"):
            assert row[name] > 0, name
    assert doc["vaults"]["delta"]["hits"] >= sum((n - 1) // 16 for n in rows)
    be = next(iter(doc["breakeven"].values()))
    assert be["prefill_model"]["basis"] and be["restore_model"]["tokens_per_s"] > 0
    assert "cold restore" in result.stdout and "time to first token" in result.stdout


def test_hf_bench_refuses_hybrid_shapes(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tierkv", "bench", "--hf", "--shape", "qwen3.6-35b-a3b"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert "hybrid" in result.stderr
