"""``benchmarks/vault_vs_redis.py`` interleaves its contenders and takes medians of per-repetition ratios."""

from __future__ import annotations

import pytest

pytest.importorskip("redis")

from benchmarks.interleave import interleaved
from benchmarks.vault_vs_redis import RATIOS, summarize


def test_every_repetition_runs_every_contender_once_in_a_rotated_order() -> None:
    calls: list[str] = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    rates = interleaved(contenders, nbytes=1000, repeats=4)  # type: ignore[arg-type]
    assert calls[:3] == ["a", "b", "c"]  # the warm-up
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert all(len(r) == 4 and min(r) > 0 for r in rates.values())


def test_ratios_are_medians_of_per_repetition_ratios_not_ratios_of_medians() -> None:
    rates = {name: [1.0, 1.0, 1.0] for pair in RATIOS.values() for name in pair}
    # outside load moves both contenders together in repetitions 1 and 2; in repetition 3 only MGET ran fast
    rates["tierkv_get"] = [2.0, 6.0, 1.0]
    rates["redis_mget"] = [1.0, 3.0, 4.0]
    row = summarize(1 << 20, 8, rates)
    assert row["get_vs_mget"] == 2.0  # median of 2, 2 and 0.25
    assert row["tierkv_get"] / row["redis_mget"] == pytest.approx(2.0 / 3.0)  # what a ratio of medians says
    assert row["runs"] == rates and row["round_bytes"] == 8 << 20
