"""What ``--link`` asks for: a line rate and, optionally, a round trip; parsed once, checked before anything
starts.

``5gbit``, ``5gbit,1ms``, ``500mbit,250us`` or a preset (``1gbe``, ``5gbe``, ``10gbe``, ``25gbe``, the
Ethernet rates users put between an inference node and its vaults). Rates are decimal, as on the wire and
in ``tc`` (1 gbit = 10**9 bits/s). The delay is a *round trip* (what ``ping`` shows between the two
machines), not a one-way figure.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from tierkv.errors import BenchError

PRESETS: dict[str, int] = {
    "1gbe": 1_000_000_000,
    "5gbe": 5_000_000_000,
    "10gbe": 10_000_000_000,
    "25gbe": 25_000_000_000,
}
"""Ethernet presets by name, in bits per second."""

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_NUMBER = r"(\d+(?:\.\d+)?)"
MAX_RTT_S = 1.0
"""A round trip above this is a typo, not a link (it would also stall every request of a bounded run)."""


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """A link between the engine and its vaults: ``rate_bps`` each way, ``rtt_s`` per request."""

    rate_bps: int
    rtt_s: float = 0.0
    name: str = ""

    @property
    def bytes_per_s(self) -> float:
        return self.rate_bps / 8

    @property
    def tc_rate(self) -> str:
        """The rate as ``tc`` takes it (bits per second, no unit: exact)."""
        return f"{self.rate_bps}bit"

    def round_trip(self) -> None:
        """Wait one round trip (the emulated latency of one request; see :mod:`.netns`); nothing
        without one. A wait in the requesting thread, so it overlaps whatever else runs meanwhile."""
        if self.rtt_s > 0:
            time.sleep(self.rtt_s)

    def label(self) -> str:
        rate = self.name or _rate_text(self.rate_bps)
        return rate + (f", {self.rtt_s * 1000:g} ms RTT" if self.rtt_s else "")

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "label": self.label(), "bytes_per_s": self.bytes_per_s}


def _rate_text(bps: int) -> str:
    for unit, scale in reversed(_RATE_UNITS.items()):
        if bps >= scale and bps % scale == 0:
            return f"{bps // scale} {unit}/s"
    return f"{bps} bit/s"


def parse_link(text: str) -> LinkSpec:
    """``RATE[,RTT]`` or ``PRESET[,RTT]``; :class:`BenchError` naming ``--link`` and what was expected."""
    rate_text, _, rtt_text = text.strip().lower().partition(",")
    rate_text = rate_text.strip()
    name = ""
    if rate_text in PRESETS:
        rate, name = PRESETS[rate_text], rate_text.upper().replace("GBE", " GbE")
    else:
        rate = _parse_rate(rate_text, text)
    rtt = _parse_rtt(rtt_text.strip(), text) if rtt_text.strip() else 0.0
    return LinkSpec(rate, rtt, name)


def _parse_rate(word: str, text: str) -> int:
    m = re.fullmatch(_NUMBER + r"\s*(" + "|".join(_RATE_UNITS) + ")", word)
    if m is None or float(m.group(1)) <= 0:
        presets = ", ".join(PRESETS)
        raise BenchError(
            f"--link: expected RATE[,RTT] such as 5gbit,1ms (units bit, kbit, mbit, gbit) or one of "
            f"{presets}, got {text!r}"
        )
    return round(float(m.group(1)) * _RATE_UNITS[m.group(2)])


def _parse_rtt(word: str, text: str) -> float:
    m = re.fullmatch(_NUMBER + r"\s*(" + "|".join(_TIME_UNITS) + ")", word)
    if m is None:
        raise BenchError(f"--link: the round trip after the comma takes a unit (1ms, 250us), got {text!r}")
    rtt = float(m.group(1)) * _TIME_UNITS[m.group(2)]
    if rtt > MAX_RTT_S:
        raise BenchError(f"--link: a round trip of {rtt:g} s is above {MAX_RTT_S:g} s, got {text!r}")
    return rtt


__all__ = ["MAX_RTT_S", "PRESETS", "LinkSpec", "parse_link"]
