"""``tierkv bench hf`` with a tiny random-weight model: prefill, hot hit and cold restore really happen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tierkv.bench.hf import DATAPLANE_TARGET, REPLAYS, SPEEDUP_AT, HFRow, targets

pytest.importorskip("transformers")


@pytest.mark.slow
def test_hf_bench_restores_from_the_vaults_and_reports_ttft(tmp_path: Path) -> None:
    out = tmp_path / "hf.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "tierkv", "bench", "hf", "--shape", "custom:2,2,32,float32",
            "--tokens", "64,160", "--repeats", "2", "--codec", "int8", "--json", str(out),
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
        assert row["restore_sources"] == ["cold"] * 2 and row["hot_sources"] == ["hot"] * 2
        assert row["restored_tokens"] == (n - 1) // 16 * 16
        assert row["bytes_fetched"] > 0
        for name in (
            "prefill_ttft_s", "hot_ttft_s", "restore_ttft_s", "prefill_tokens_per_s", "speedup",
            "restore_s", "compute_s", "restore_tokens_per_s", "dataplane_gbps", "restore_vs_dataplane",
        ):  # fmt: skip
            assert row[name] > 0, name
        # the restore is its parts, and the cold TTFT holds the restore plus the last tokens' forward pass
        shares = [row[f"{part}_share"] for part in ("plan", "network", "codec", "inject")]
        assert sum(shares) == pytest.approx(1.0) and row["network_share"] > 0 and row["codec_share"] > 0
        runs = row["runs"]
        assert all(t > r for t, r in zip(runs["restore_ttft_s"], runs["restore_s"], strict=True))
        # the data plane replayed exactly the restore's BatchGet, REPLAYS times per repeat
        assert row["dataplane_bytes"] == row["bytes_fetched"] and len(runs["dataplane_s"]) == 2 * REPLAYS
    assert doc["vaults"]["delta"]["hits"] >= sum((n - 1) // 16 for n in rows)
    assert doc["vaults"]["delta"]["keys"] == 0, "the run deletes what it stored"
    assert [t["name"] for t in doc["targets"]] == ["speedup_at_4k", "restore_vs_dataplane", "restore_linear"]
    assert doc["targets"][0]["met"] is None and set(doc["targets"][2]["value"]) == {"64", "160"}
    raw, int8 = doc["quality"]["raw"], doc["quality"]["int8"]
    assert raw["agreement"] == 1.0 and raw["max_logit_error"] < 1e-4  # float32: restore is exact
    assert int8["new_tokens"] == 64 and int8["restored_tokens"] == 48
    assert int8["teacher_forced_agreement"] >= 0.9 and int8["max_logit_error"] > 0
    be = next(iter(doc["breakeven"].values()))
    assert be["prefill_model"]["basis"] and be["restore_model"]["tokens_per_s"] > 0
    for heading in (
        "time to first token",
        "cold restore",
        "restore ÷ data plane",
        "targets",
        "teacher-forced",
    ):
        assert heading in result.stdout, heading


def test_hf_bench_refuses_hybrid_shapes(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tierkv", "bench", "hf", "--shape", "qwen3.6-35b-a3b"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert "hybrid" in result.stderr


def _row(tokens: int, prefill: float, restore_ttft: float, restore: float, dataplane: float) -> HFRow:
    row = HFRow(tokens, prefill_ttft_s=[prefill], restore_ttft_s=[restore_ttft], restore_s=[restore])
    row.dataplane_s = [dataplane]
    row.restored_tokens = tokens - 16
    row.bytes_fetched = row.dataplane_bytes = (tokens - 16) * 12288
    return row


def test_targets_read_the_rows() -> None:
    fast = [_row(1024, 1.3, 0.10, 0.02, 0.012), _row(SPEEDUP_AT, 5.8, 0.2, 0.08, 0.06)]
    speed, plane, linear = targets(fast)
    assert speed.met is True and speed.value == pytest.approx(29.0)
    assert plane.met is True and plane.value[SPEEDUP_AT] == pytest.approx(0.08 / 0.06)
    assert "at 1,024 tokens" in plane.measured  # the worst ratio is named
    assert linear.met is None and linear.value[1024] == pytest.approx(1008 / 0.02)
    assert "fit " in linear.measured  # two lengths: a line through the restore times

    slow = [_row(SPEEDUP_AT, 5.8, 0.5, 0.3, 0.1)]
    speed, plane, _ = targets(slow)
    assert speed.met is False and plane.met is False and plane.value[SPEEDUP_AT] > DATAPLANE_TARGET

    speed, plane, _ = targets([_row(512, 0.6, 0.1, 0.01, 0.01)])
    assert speed.met is None and "not measured" in speed.measured
