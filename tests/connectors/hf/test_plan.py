"""The transformers hook's restore plan: hot tier, vaults, or both."""

from __future__ import annotations

from tierkv.connectors.hf.plan import RestorePlan, plan_restore


def test_at_least_one_token_is_computed() -> None:
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
