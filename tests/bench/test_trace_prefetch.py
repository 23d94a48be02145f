"""``tierkv bench trace --prefetch``: the prefetch on/off replay through real vaults and the pipeline."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.test_synthetic import bench
from tests.bench.test_trace import BLOB, TINY_ARGS, _request
from tierkv.bench.common import Deadline
from tierkv.bench.trace import Trace
from tierkv.bench.trace.prefetch import PrefetchSettings, replay_prefetch
from tierkv.bench.trace.replay import ReplaySettings, prepare


def test_the_continuation_restored_next_comes_from_the_buffer_on_one_side_only(tmp_path: Path) -> None:
    first = _request("t0", ("sys", 32, "axioms"), ("q", 16, "user_turn"))  # 3 full blocks
    longer = _request("t0", ("sys", 32, "axioms"), ("q", 16, "user_turn"), ("more", 20, "user_turn"))
    settings = ReplaySettings(policies=("context",), capacities=(1.0,), blob_bytes=BLOB)
    work = prepare(Trace((first, first, longer)), settings)
    for side in ("on", "off"):
        (tmp_path / side).mkdir()
    run = replay_prefetch(
        work, settings, PrefetchSettings(1 << 20, gap_s=0.2), tmp_path, lambda: None, Deadline(120)
    )
    assert run is not None
    # `first` again restores 2 blocks (its last block holds the last token); the prefetch after it fetches
    # the third, which `longer` then restores from the buffer instead of the vault
    assert run.on.blocks == run.off.blocks == 2 + 3
    assert (run.on.from_buffer, run.off.from_buffer) == (1, 0)
    doc = run.as_dict()
    assert doc["restores"] == 2 and doc["block_share_from_prefetch"] == 1 / 5
    # what was prefetched was used or wasted (the last request's own new block may or may not be stored
    # before the prefetch after its restore asks, so it may be prefetched and wasted)
    assert doc["prefetched_bytes"] == doc["bytes_from_prefetch"] + doc["wasted_bytes"] > 0
    assert doc["median_saved_ms"] is not None


def test_the_command_reports_the_comparison(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    args = ["--prefetch", "1MiB", "--prefetch-only", "--prefetch-gap-ms", "0", "--blob-bytes", "32KiB"]
    args += ["--capacities", "100%"]
    result = bench("trace", *TINY_ARGS, *args, "--json", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout
    doc = json.loads(out.read_text())
    assert doc["runs"] == [] and doc["prefetch"]["restores"] > 0
    assert doc["prefetch"]["blocks_restored"]["off"] > 0
    assert "prefetch on/off" in result.stdout


def test_prefetch_only_needs_a_buffer_size(tmp_path: Path) -> None:
    result = bench("trace", *TINY_ARGS, "--prefetch-only", cwd=tmp_path)
    assert result.returncode == 2 and "--prefetch-only needs --prefetch SIZE" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
