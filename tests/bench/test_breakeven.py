"""Break-even arithmetic on inputs whose answers are known by hand."""

from __future__ import annotations

import math

import pytest

from tierkv.bench.breakeven import (
    PrefillModel,
    RestoreModel,
    break_even,
    crossover,
    net_of,
)


def test_linear_prefill_against_restore_with_fixed_cost() -> None:
    # prefill 1000 tok/s = 1 ms/token; restore 10 ms + 0.01 ms/token: equal at n = 10 / 0.99 = 10.10...
    prefill = PrefillModel.from_rate(1000.0, measured_at=4096)
    restore = RestoreModel(fixed_s=0.010, per_token_s=1e-5)
    assert crossover(prefill, restore) == pytest.approx(0.010 / (1e-3 - 1e-5))
    be = break_even(prefill, restore)
    assert be.tokens == 11
    assert prefill.seconds(be.tokens) > restore.seconds(be.tokens)
    assert prefill.seconds(be.tokens - 1) <= restore.seconds(be.tokens - 1)
    at8k = be.savings[0]
    assert at8k.tokens == 8192
    assert at8k.prefill_s == pytest.approx(8.192)
    assert at8k.restore_s == pytest.approx(0.010 + 0.08192)
    assert at8k.saved_s == pytest.approx(8.192 - 0.09192)
    assert [s.tokens for s in be.savings] == [8192, 32768, 131072]
    assert "measured at 4096 tokens" in prefill.basis


def test_restore_slower_per_token_than_linear_prefill_never_wins() -> None:
    prefill = PrefillModel.from_rate(100_000.0)
    restore = RestoreModel.from_throughput(bytes_per_s=1e9, bytes_per_token=131072, fixed_s=0.001)
    # restore moves 7,629 tokens/s: slower than this prefill at every length
    assert crossover(prefill, restore) is None
    be = break_even(prefill, restore)
    assert be.tokens is None
    assert all(s.saved_s < 0 for s in be.savings)


def test_quadratic_prefill_always_overtakes_eventually() -> None:
    # prefill 1e-5·n + 1e-9·n²; restore 0.1 s + 2e-5·n: solve 1e-9 n² - 1e-5 n - 0.1 = 0
    prefill = PrefillModel(a=1e-5, b=1e-9)
    restore = RestoreModel(fixed_s=0.1, per_token_s=2e-5)
    root = (1e-5 + math.sqrt(1e-10 + 4e-10)) / 2e-9
    assert crossover(prefill, restore) == pytest.approx(root)
    assert break_even(prefill, restore).tokens == math.floor(root) + 1


def test_fit_recovers_exact_quadratic_from_two_lengths() -> None:
    a, b = 4e-4, 6e-8
    points = [(n, a * n + b * n * n) for n in (1024, 4096)]
    model = PrefillModel.fit(points)
    assert model.a == pytest.approx(a)
    assert model.b == pytest.approx(b)
    assert "fitted to 1,024, 4,096 tokens" in model.basis
    # superlinear: the average rate falls with length
    assert model.rate_at(32768) < model.rate_at(1024)


def test_fit_falls_back_to_a_line_when_noise_bends_it_negative() -> None:
    # the longer prompt is relatively *faster*: a quadratic fit would need b < 0
    model = PrefillModel.fit([(1000, 1.0), (2000, 1.5)])
    assert model.b == 0.0
    assert model.a == pytest.approx((1000 * 1.0 + 2000 * 1.5) / (1000**2 + 2000**2))
    one = PrefillModel.fit([(512, 0.5)])
    assert one.b == 0.0 and one.a == pytest.approx(0.5 / 512)


def test_restore_fit_has_intercept_and_slope() -> None:
    model = RestoreModel.fit([(1024, 0.012), (4096, 0.042), (1024, 0.012)], bytes_per_token=12288)
    assert model.per_token_s == pytest.approx(0.030 / 3072)
    assert model.fixed_s == pytest.approx(0.012 - 1024 * 0.030 / 3072)
    assert model.bytes_per_s == pytest.approx(12288 * 3072 / 0.030)
    through_origin = RestoreModel.fit([(1000, 0.5), (2000, 0.4)])
    assert through_origin.fixed_s == 0.0


def test_common_cost_leaves_break_even_alone_and_shows_in_savings() -> None:
    prefill = PrefillModel(a=1e-3)
    restore = RestoreModel(fixed_s=0.02, per_token_s=1e-4)
    plain = break_even(prefill, restore)
    shifted = break_even(prefill, restore, common_s=0.05)
    assert plain.tokens == shifted.tokens
    assert shifted.savings[0].prefill_s == pytest.approx(plain.savings[0].prefill_s + 0.05)
    assert shifted.savings[0].saved_s == pytest.approx(plain.savings[0].saved_s)
    assert net_of([(10, 0.3), (20, 0.01)], 0.05) == [(10, pytest.approx(0.25)), (20, 1e-6)]


@pytest.mark.parametrize(
    "make",
    [
        lambda: PrefillModel.from_rate(0),
        lambda: PrefillModel(a=0.0, b=0.0),
        lambda: PrefillModel.fit([]),
        lambda: PrefillModel.fit([(100, -1.0)]),
        lambda: RestoreModel(fixed_s=-1.0, per_token_s=1.0),
        lambda: break_even(PrefillModel(a=1.0), RestoreModel(0.0, 1.0), common_s=-1),
    ],
)
def test_nonsense_inputs_are_refused(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]
