"""``benchmarks/vllm_restore_ttft.py``: the bound it reports and where a restore's time goes."""

from __future__ import annotations

import pytest

from benchmarks.vllm_restore_ttft import TIMERS, summarize


def samples(**medians: float) -> dict[str, list[float]]:
    """Three runs per figure whose median is the given value (the others bracket it)."""
    return {k: [v * 0.5, v, v * 3] for k, v in medians.items()}


def test_the_bound_is_the_prefix_cache_plus_one_and_a_half_wires_and_the_rest_is_what_timers_miss() -> None:
    timers = dict.fromkeys(TIMERS, 0.001) | {"lookup_wait_us": 0.002, "load_us": 0.020}
    row = summarize(
        2048,
        samples(prefill=0.5, restore=0.060, local=0.030, wire=0.015, bytes=33e6, **timers),
    )
    assert row["bound_ms"] == pytest.approx(30 + 1.5 * 15) and row["within_bound"] is False
    assert row["wire_gbps"] == pytest.approx(2.2)
    assert row["breakdown_ms"]["steps_and_other"] == pytest.approx(60 - 30 - 2 - 20)
    assert row["prefill_over_restore"] == pytest.approx(500 / 60, abs=0.01)
    met = summarize(2048, samples(prefill=0.5, restore=0.052, local=0.030, wire=0.015, bytes=33e6, **timers))
    assert met["within_bound"] is True
