"""``tierkv bench llamacpp`` end to end: vaults the bench starts, a JSON document, every restore checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (make test-llamacpp)")

pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(300)]


@pytest.mark.parametrize("flags", [["--kv", "q8_0"], ["--no-flash-attn"]])
def test_bench_llamacpp_runs_through_local_vaults_and_reports_identical_restores(flags: list[str]) -> None:
    cmd = [sys.executable, "-m", "tierkv", "bench", "llamacpp", "--tokens", "64,100", "--repeats", "1"]
    cmd += ["--layers", "2", "--hidden", "256", *flags, "--json", "-"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and "faster than prefill" in doc["verdict"]
    assert [r["tokens"] for r in doc["rows"]] == [64, 100]
    assert all(r["identical"] and r["restored"] == (r["tokens"] - 1) // 16 * 16 for r in doc["rows"])
    assert all(
        r["fetched_bytes"] > 0 and set(r["parts"]) == {"network", "load", "compute"} for r in doc["rows"]
    )
    (after,) = doc["vaults"]["after"]
    assert after["keys"] > 0 and after["hits"] > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kv", "q3_k"], "--kv: one of f16, q8_0, q4_0"),
        (["--kv", "q8_0", "--hidden", "128"], "--kv q8_0 needs a head dim that is a multiple of 32"),
    ],
)
def test_bench_llamacpp_refuses_bad_settings_in_one_line(flags: list[str], message: str) -> None:
    cmd = [sys.executable, "-m", "tierkv", "bench", "llamacpp", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr
    assert "Traceback" not in done.stderr
