"""``--link`` text: presets, rates and round trips, and one line naming the flag for anything else."""

from __future__ import annotations

import pytest

from tierkv.bench.link import PRESETS, parse_link
from tierkv.errors import BenchError


@pytest.mark.parametrize(
    ("text", "bps", "rtt"),
    [
        ("5gbit", 5_000_000_000, 0.0),
        ("5gbit,1ms", 5_000_000_000, 0.001),
        ("2.5gbit, 250us", 2_500_000_000, 0.00025),
        ("500mbit", 500_000_000, 0.0),
        ("25GbE,0.5ms", 25_000_000_000, 0.0005),
        ("1gbe", 1_000_000_000, 0.0),
    ],
)
def test_rates_are_decimal_bits_and_the_delay_is_a_round_trip(text: str, bps: int, rtt: float) -> None:
    spec = parse_link(text)
    assert spec.rate_bps == bps and spec.rtt_s == pytest.approx(rtt)
    assert spec.bytes_per_s == bps / 8 and spec.tc_rate == f"{bps}bit"


def test_presets_are_the_ethernet_rates_and_are_named_so() -> None:
    assert {name: rate // 10**9 for name, rate in PRESETS.items()} == {
        "1gbe": 1,
        "5gbe": 5,
        "10gbe": 10,
        "25gbe": 25,
    }
    assert parse_link("10gbe,1ms").label() == "10 GbE, 1 ms RTT"
    assert parse_link("5gbit").label() == "5 gbit/s"


@pytest.mark.parametrize("text", ["5", "5gb", "fast", "0gbit", "5gbit,1", "5gbit,soon", "5gbit,2s", ""])
def test_anything_else_is_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(BenchError, match=r"^--link: ") as caught:
        parse_link(text)
    assert "\n" not in str(caught.value)
