"""The ``context`` policy: scores an entry by what the application said about it (importance), how it is
used (decayed hits, prefix sharing), its size and its age — see :func:`context_score`. Its rank is still
fixed between updates: age is measured in the store's clock, so "score now" and "score + age credit at the
last update" order entries alike (:meth:`ContextPolicy.rank`), and eviction stays one cursor step on the
ordered index, exact, with no scan and no sampling.
"""

from __future__ import annotations

import struct

from tierkv.config import ContextWeights
from tierkv.retention.score import context_score, context_value, decayed_hits, turnover
from tierkv.vault.policy.base import EntryInfo

_DOUBLE = struct.Struct(">d")


class ContextPolicy:
    """Lowest :func:`context_score` first; ties by age."""

    name = "context"
    uses_meta = True

    def __init__(self, weights: ContextWeights | None = None) -> None:
        self.weights = weights or ContextWeights()

    def turnover(self, population: int) -> int:
        """Store events in one turnover: the population, at least ``min_turnover``."""
        return turnover(self.weights, population)

    def rank(self, entry: EntryInfo) -> bytes:
        """``clock + turnover · value / w_age``: ordering by it is ordering by the score at any later
        clock (both differ from the score by the same amount for every entry, ``now`` and the population
        taken as common)."""
        value = context_value(
            self.weights,
            importance=entry.importance,
            hits=entry.hits,
            sharing=entry.sharing,
            size=entry.size,
        )
        key = entry.clock + self.turnover(entry.population) * value / self.weights.age
        return _ordered(key) + entry.clock.to_bytes(8, "big")

    def decayed_hits(self, hits: float, elapsed: int, population: int) -> float:
        """``hits`` after ``elapsed`` clock ticks: halved every ``hit_half_life`` turnovers."""
        return decayed_hits(self.weights, hits, elapsed, population)


def _ordered(value: float) -> bytes:
    """8 bytes that sort as the float does (sign bit flipped; negatives inverted)."""
    raw = bytearray(_DOUBLE.pack(value))
    if raw[0] & 0x80:
        return bytes(b ^ 0xFF for b in raw)
    raw[0] |= 0x80
    return bytes(raw)


__all__ = ["ContextPolicy", "context_score", "context_value"]
