"""``benchmarks/vault_policy_put.py`` against real vault processes on loopback: each policy's vault runs
the policy asked for, in steady-state eviction, and every contender gets a wall-clock and a vault-CPU
ratio to ``lru``."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.vault_policy_put import measure

pytestmark = pytest.mark.slow


def test_each_vault_runs_its_policy_past_its_budget_and_is_timed(tmp_path: Path) -> None:
    budget, blob, per_batch = 1 << 20, 64 << 10, 4
    result = measure(["lru", "adaptive"], budget, 2, tmp_path, sizes={"64KiB": (blob, per_batch)})["64KiB"]
    assert result["policy"] == {"lru": "lru", "adaptive": "adaptive"}
    evictions = result["evictions"]
    assert isinstance(evictions, dict)
    # filled past the budget, then 3 calls × 8 Puts of 4 new blobs each, which evict as much as they add
    assert all(n >= 3 * 8 * per_batch for n in evictions.values()), evictions
    for key in ("ratio_to_lru", "vault_cpu_ratio_to_lru"):
        ratios = result[key]
        assert isinstance(ratios, dict) and ratios["lru"] == 1.0 and ratios["adaptive"] > 0, (key, ratios)
    per_put = result["vault_cpu_us_per_put"]
    assert isinstance(per_put, dict) and all(us > 0 for us in per_put.values()), per_put
