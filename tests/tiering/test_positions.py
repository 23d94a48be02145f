from __future__ import annotations

import pytest

from tierkv.tiering.plan import (
    RestorePlan,
    plan_restore,
    restore_limit,
    snapshot_boundaries,
    snapshot_candidates,
)


def test_at_least_one_token_is_computed() -> None:
    assert restore_limit(1) == 0 and restore_limit(0) == 0 and restore_limit(33) == 32
    plan = plan_restore(prompt_len=32, block_size=16, hot_tokens=32, cold_blocks=2)
    assert plan.restored == 31 and plan.computed == 1 and plan.source == "hot"
    plan = plan_restore(prompt_len=32, block_size=16, hot_tokens=0, cold_blocks=2)
    assert plan.restored == 16 and plan.cold_blocks == 1 and plan.source == "cold"


def test_hot_wins_ties_and_cold_extends_hot() -> None:
    plan = plan_restore(prompt_len=100, block_size=16, hot_tokens=40, cold_blocks=2)
    assert plan == RestorePlan(100, 16, hot_tokens=40)
    plan = plan_restore(prompt_len=100, block_size=16, hot_tokens=40, cold_blocks=5)
    # The hot entry serves the two whole blocks it covers; blocks 2..4 come from the vaults.
    assert (plan.hot_tokens, plan.cold_start, plan.cold_stop) == (32, 2, 5)
    assert plan.restored == 80 and plan.cold_tokens == 48 and plan.source == "hot+cold"
    assert plan_restore(100, 16, 0, 0).source == "none"


def test_snapshot_boundaries() -> None:
    assert snapshot_boundaries(0, 70, 16, 2) == [32, 64]
    assert snapshot_boundaries(0, 90, 16, 2) == [32, 64, 80]
    assert snapshot_boundaries(32, 47, 16, 1) == []
    assert snapshot_boundaries(30, 48, 16, 1) == [32, 48]
    with pytest.raises(ValueError):
        snapshot_boundaries(0, 10, 16, 0)


def test_snapshot_candidates() -> None:
    assert snapshot_candidates(5, 2) == [5, 4]
    assert snapshot_candidates(4, 2) == [4, 2]
    assert snapshot_candidates(1, 4) == [1]
    assert snapshot_candidates(0, 1) == []
    assert snapshot_candidates(9, 1, limit=3) == [9, 8, 7]
