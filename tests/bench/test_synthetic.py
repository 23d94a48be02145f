"""``tierkv bench synthetic`` end to end: real vault processes, real LMDB, the JSON a script reads."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from tests.conftest import VaultFactory
from tierkv.bench.shapes import SHAPES
from tierkv.bench.synthetic import SyntheticSettings, run_synthetic
from tierkv.bench.vaults import VaultSettings
from tierkv.client.vault import VaultClient
from tierkv.config import config_from_dict

CELL_FIELDS = {
    "tokens",
    "codec",
    "blocks",
    "repeats",
    "kv_bytes",
    "kv_wire_bytes",
    "compression",
    "kv_bytes_per_token",
    "stored_bytes_per_token",
    "store_gbps",
    "restore_gbps",
    "store_wire_gbps",
    "restore_wire_gbps",
    "restore_tokens_per_s",
    "store_batch_ms_p50",
    "store_batch_ms_p99",
    "restore_batch_ms_p50",
    "restore_batch_ms_p99",
    "lookup_ms_median",
    "encode_gbps",
    "decode_gbps",
    "missing_blocks",
    "bit_exact",
    "complete",
    "store_s",
    "restore_s",
}


def bench(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``tierkv bench ARGS`` as a user runs it (the console script's module), in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "tierkv", "bench", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def check_document(doc: dict[str, Any], lengths: list[int], codecs: list[str], repeats: int) -> None:
    assert doc["ok"] is True and doc["mode"] == "synthetic" and doc["schema"] == 1
    assert doc["errors"] == [] and doc["truncated"] is False
    assert doc["versions"]["tierkv"] and doc["versions"]["python"] and doc["versions"]["numpy"]
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["memory_bytes"] > 0
    assert doc["settings"]["lengths"] == lengths and doc["settings"]["repeats"] == repeats
    assert doc["started_at"] and doc["duration_s"] > 0
    assert doc["decoder"] == "torch"  # auto: torch is installed here, as the engine hooks decode
    assert {(c["tokens"], c["codec"]) for c in doc["results"]} == {(n, c) for n in lengths for c in codecs}
    kv_per_token = SHAPES["qwen2.5-0.5b"].kv_bytes_per_token
    for cell in doc["results"]:
        missing = CELL_FIELDS - set(cell)
        assert not missing, missing
        assert cell["complete"] and cell["missing_blocks"] == 0 and cell["repeats"] == repeats
        assert cell["blocks"] == cell["tokens"] // 16
        assert cell["kv_bytes"] == cell["tokens"] * kv_per_token
        assert cell["kv_bytes_per_token"] == kv_per_token
        for name in ("store_gbps", "restore_gbps", "restore_tokens_per_s", "encode_gbps", "decode_gbps"):
            assert cell[name] > 0 and math.isfinite(cell[name]), name
        assert 0 < cell["restore_batch_ms_p50"] <= cell["restore_batch_ms_p99"]
        assert 0 < cell["store_batch_ms_p50"] <= cell["store_batch_ms_p99"]
        assert len(cell["store_s"]) == len(cell["restore_s"]) == repeats
        if cell["codec"] == "raw":
            assert cell["bit_exact"] is True
            assert cell["compression"] == kv_per_token * cell["tokens"] / cell["kv_wire_bytes"]
            assert 0.99 < cell["compression"] <= 1.0  # headers only
        else:
            assert cell["bit_exact"] is None
            assert 1.7 < cell["compression"] < 2.0  # int8 plus a scale per group of 64
            assert cell["stored_bytes_per_token"] < kv_per_token
    raw, int8 = doc["codecs"]["raw"], doc["codecs"]["int8"]
    assert raw["lossless"] is True and raw["snr_db"] is None  # +inf is written as null
    assert int8["lossless"] is False and 35 < int8["snr_db"] < 55
    assert set(doc["restore_models"]) == set(codecs)
    for model in doc["restore_models"].values():
        assert model["tokens_per_s"] > 0 and model["bytes_per_token"] == kv_per_token


def test_synthetic_bench_starts_its_own_vaults_and_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "figures" / "bench.json"
    result = bench(
        "synthetic", "--tokens", "64,256", "--repeats", "2", "--batch-mib", "1", "--prefill-tps", "800",
        "--prefill-at", "4096", "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    check_document(doc, [64, 256], ["raw", "int8"], 2)
    assert doc["vaults"]["source"] == "local"
    delta = doc["vaults"]["delta"]
    assert delta["hits"] == 2 * 2 * (64 + 256) // 16 + 2 * 2  # every restored block, plus the warm-up
    assert delta["misses"] == 0 and delta["evictions"] == 0 and delta["corrupt"] == 0
    assert delta["keys"] == 0  # the bench deletes what it stored
    be = doc["breakeven"]["raw"]
    assert be["prefill_model"]["basis"] == "linear, 800 tokens/s measured at 4096 tokens"
    assert be["tokens"] is not None and be["tokens"] >= 1
    assert [s["tokens"] for s in be["savings"]] == [8192, 32768, 131072]
    assert be["savings"][0]["prefill_s"] == 8192 / 800
    assert "Tiering pays above" in doc["verdict"]
    # the human output: tables and the one-line verdict
    assert "store and restore through the vaults" in result.stdout
    assert "int8 decoded with torch" in result.stdout
    assert "Tiering pays above" in result.stdout


def test_json_to_stdout_keeps_stdout_parseable(tmp_path: Path) -> None:
    result = bench(
        "synthetic", "--tokens", "32", "--repeats", "1", "--codec", "raw", "--json", "-", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ok"] and doc["breakeven"] == {} and "--prefill-tps" in doc["verdict"]
    assert "store and restore" in result.stderr
    assert "int8 decoded" not in result.stderr  # no int8 in this run


def test_configured_vaults_are_used_when_reachable(vault_factory: VaultFactory, tmp_path: Path) -> None:
    kv = vault_factory(name="kv", max_bytes="64MiB")
    toml = tmp_path / "tierkv.toml"
    toml.write_text(f'[cluster.kv_cold]\nhost = "127.0.0.1"\nport = {kv.port}\n')
    out = tmp_path / "b.json"
    result = bench(
        "synthetic", "--config", str(toml), "--use-config-vaults", "--tokens", "128", "--repeats", "1",
        "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert doc["vaults"]["source"] == "config"
    assert doc["vaults"]["addresses"] == {"kv_cold": [kv.address]}
    assert doc["vaults"]["delta"]["hits"] == 2 * 128 // 16 + 2 * 2
    with VaultClient(kv.address) as client:
        stats = client.stats()
    assert stats.hits >= 2 * 128 // 16 and stats.keys == 0  # measured there, and cleaned up


def test_unreachable_configured_vaults_fail_in_config_mode_and_fall_back_in_auto(tmp_path: Path) -> None:
    toml = tmp_path / "tierkv.toml"
    toml.write_text('[cluster]\ntimeout = 0.5\n[cluster.kv_cold]\nhost = "127.0.0.1"\nport = 9\n')
    strict = bench(
        "synthetic",
        "--config",
        str(toml),
        "--use-config-vaults",
        "--tokens",
        "32",
        "--repeats",
        "1",
        cwd=tmp_path,
    )
    assert strict.returncode == 2
    assert "unreachable" in strict.stderr
    out = tmp_path / "b.json"
    auto = bench(
        "synthetic", "--config", str(toml), "--vaults", "auto", "--tokens", "32", "--repeats", "1",
        "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert auto.returncode == 0, auto.stdout + auto.stderr
    doc = json.loads(out.read_text())
    assert doc["vaults"]["source"] == "local"
    assert any("unreachable" in w for w in doc["warnings"])


def test_bad_flags_exit_with_usage_errors(tmp_path: Path) -> None:
    assert bench("synthetic", "--shape", "gpt-nothing", cwd=tmp_path).returncode == 2
    assert bench("synthetic", "--tokens", "8", cwd=tmp_path).returncode == 2  # shorter than one block
    assert bench("synthetic", "--codec", "zstd", "--tokens", "32", cwd=tmp_path).returncode == 2
    assert bench("synthetic", "--decoder", "cuda", "--tokens", "32", cwd=tmp_path).returncode == 2
    assert bench("synthetic", "--batch-mib", "1", "--tokens", "x", cwd=tmp_path).returncode == 2
    assert bench("hf", "--batch-mib", "1", cwd=tmp_path).returncode == 2  # not an hf option


def test_hybrid_shape_sends_state_snapshots_to_ssm_cold(tmp_path: Path) -> None:
    shape = SHAPES["qwen3.6-35b-a3b"]
    settings = SyntheticSettings(
        shape=shape, lengths=(64,), codecs=("int8",), repeats=1, ssm_every=32, max_seconds=60
    )
    result = run_synthetic(
        config_from_dict({}), settings, VaultSettings(mode="local", state_dir=tmp_path), Console(quiet=True)
    )
    assert result.ok, result.errors
    (cell,) = result.cells
    assert cell.snapshots_stored == 2  # at 32 and 64 tokens
    assert cell.ssm_restore_wire_bytes > shape.ssm_bytes_per_snapshot  # one snapshot back (raw + header)
    assert cell.restore_bytes == cell.kv_bytes + shape.ssm_bytes_per_snapshot
    by_role = {row["role"]: row for row in result.vaults["after"]}
    assert set(by_role) == {"kv_cold", "ssm_cold"}
    assert (
        by_role["ssm_cold"]["hits"] == 1
        and by_role["ssm_cold"]["bytes_in"] >= 2 * shape.ssm_bytes_per_snapshot
    )
    figures = cell.figures()
    assert figures["stored_bytes_per_token"] > 2 * shape.ssm_bytes_per_snapshot / 64
