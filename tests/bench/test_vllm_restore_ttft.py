"""``benchmarks/vllm_restore_ttft.py``: the bound it reports and where a restore's time goes."""

from __future__ import annotations

import pytest

from benchmarks.vllm_restore_ttft import TIMERS, summarize


def samples(**medians: float) -> dict[str, list[float]]:
    """Three runs per figure whose median is the given value (the others bracket it)."""
    return {k: [v * 0.5, v, v * 3] for k, v in medians.items()}


def test_the_bound_is_the_prefix_cache_plus_one_and_a_half_wires_and_the_rest_is_what_timers_miss() -> None:
    timers = dict.fromkeys(TIMERS, 0.001) | {"lookup_wait_us": 0.002, "load_us": 0.020, "gc_extra": 0.0}
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


def test_the_bound_is_also_checked_run_by_run_against_each_runs_own_local_and_wire() -> None:
    """Each run's margin is ``restore - local - 1.5 x wire`` of that run, not of the medians."""
    timers = dict.fromkeys([*TIMERS, "gc_extra"], 0.0)
    row = summarize(
        960,
        {
            "prefill": [0.3] * 3,
            "restore": [0.050, 0.060, 0.070],
            "local": [0.040, 0.030, 0.050],
            "wire": [0.010, 0.010, 0.010],
            "bytes": [15e6] * 3,
            **{k: [v] * 3 for k, v in timers.items()},
        },
    )
    # margins: -5, +15, +5 ms; the medians (restore 60, local 40, wire 10) give a bound of 55 ms
    assert row["runs_within_bound"] == 1
    assert row["paired_margin_ms"] == pytest.approx(5)
    assert row["within_bound"] is False and row["bound_ms"] == pytest.approx(55)
    assert row["runs_ms"]["wire"] == [10, 10, 10]
