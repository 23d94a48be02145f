"""``benchmarks/links.py`` end to end on loopback (no root needed): every contender measured, every ratio
taken per repetition, the restores of all three contenders complete."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import mooncake_store
from benchmarks.links import ratios

pytestmark = pytest.mark.slow


def test_ratios_are_taken_per_repetition_and_keep_their_spread() -> None:
    got = ratios([2.0, 1.0, 3.0], [1.0, 1.0, 1.0])
    assert got == {"median": 2.0, "min": 1.0, "max": 3.0}
    # outside load moving both contenders together cancels out of a per-repetition ratio
    assert ratios([1.0, 0.5, 1.0], [2.0, 1.0, 2.0])["max"] == 0.5


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (setup-redis.sh)")
def test_a_loopback_run_measures_every_contender(tmp_path: Path) -> None:
    out = tmp_path / "links.json"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.links", "--links", "loopback", "--round-mib", "1",
         "--blob-kib", "256", "--put-blob-kib", "256,1024", "--no-mooncake",
         "--repeats", "2", "--tokens", "64", "--synthetic-seconds", "60",
         "--max-seconds", "180", "--json", str(out)],
        cwd=root, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (doc,) = json.loads(out.read_text())["links"]
    assert doc["link"] == "loopback"
    (read,) = doc["reads"]
    assert read["blob_bytes"] == 256 * 1024 and read["round_bytes"] == 1 << 20
    for name in ("tierkv_get_buffers", "redis_mget", "tcp"):
        assert len(read["runs"][name]) == 2 and read[name] > 0
    assert read["get_buffers_vs_tcp"]["min"] <= read["get_buffers_vs_tcp"]["median"]
    assert "mooncake_get_into" not in read and "get_buffers_vs_mooncake" not in read
    assert [w["blob_bytes"] for w in doc["writes"]] == [256 * 1024, 1 << 20]
    for write in doc["writes"]:
        for name in ("tierkv_put_durable", "tierkv_put_fast"):
            assert len(write["runs"][name]) == 2 and write[name] > 0
    (row,) = doc["synthetic"]["rows"]
    assert row["tokens"] == 64 and doc["synthetic"]["errors"] == []
    for name in ("raw", "int8_behind", "int8"):
        assert row[name]["restore_gbps"] > 0 and len(row[name]["restore_s"]) == 2
    assert row["int8_behind_vs_raw"]["median"] > 0 and row["behind_vs_after"]["median"] > 0
    assert row["int8_vs_raw"]["median"] > 0
    assert "### loopback" in done.stdout


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (setup-redis.sh)")
@pytest.mark.skipif(not mooncake_store.available(), reason="no .venv-mooncake (benchmarks/setup-mooncake.sh)")
def test_mooncake_is_measured_beside_tierkv_where_it_is_built(tmp_path: Path) -> None:
    out = tmp_path / "links.json"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.links", "--links", "loopback", "--round-mib", "1",
         "--blob-kib", "256", "--put-blob-kib", "256", "--mooncake", "--repeats", "2", "--tokens", "",
         "--max-seconds", "180", "--json", str(out)],
        cwd=root, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (doc,) = json.loads(out.read_text())["links"]
    (read,), (write,) = doc["reads"], doc["writes"]
    assert len(read["runs"]["mooncake_get_into"]) == 2 and read["get_buffers_vs_mooncake"]["median"] > 0
    assert len(write["runs"]["mooncake_put_batch"]) == 2 and write["durable_vs_mooncake"]["median"] > 0
