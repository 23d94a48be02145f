"""``tierkv demo --cluster`` end to end: progress per request, where each went and why, the restores from
the vaults once the replicas dropped their caches, and a verdict line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from rich.console import Console

from tierkv.routing.cluster import router_executable
from tierkv.routing.demo import run_cluster_demo

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_cluster_demo_shows_what_tierkv_adds(tmp_path: Path) -> None:
    if router_executable() is None:
        pytest.skip("vllm-router is not installed (scripts/setup-vllm-env.sh installs it)")
    console = Console(file=io.StringIO(), width=200)
    served = run_cluster_demo(tmp_path / "state", console)
    text = console.file.getvalue()
    again = [r for r in served if r.turn.turn == 0 and r.turn.conversation == 0][-2:]
    assert all(r.restored > 0 for r in again), text
    assert text.count("request ") >= 8 and "again 2:" in text, text
    assert "verdict: tierkv restored" in text, text
