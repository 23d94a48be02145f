"""The ``context`` policy: scores an entry by what the application said about it (importance), how it is
used (decayed hits, prefix sharing), its size and its age — see :func:`context_score`. Its rank is still
fixed between updates: age is measured in the store's clock, so "score now" and "score + age credit at the
last update" order entries alike (:meth:`ContextPolicy.rank`), and eviction stays one cursor step on the
ordered index, exact, with no scan and no sampling.
"""

from __future__ import annotations

import math
import struct

from tierkv.config import ContextWeights
from tierkv.vault.policy.base import EntryInfo

_DOUBLE = struct.Struct(">d")


def context_value(w: ContextWeights, *, importance: float, hits: float, sharing: int, size: int) -> float:
    """The part of the score that does not age: what the entry is worth, in turnovers of credit."""
    return (
        w.importance * importance
        + w.hits * math.log2(1.0 + max(0.0, hits))
        + w.sharing * math.log2(1.0 + max(0, sharing))
        - w.size * math.log2(max(1, size) / 1024)
    )


def context_score(
    w: ContextWeights, *, importance: float, hits: float, sharing: int, size: int, age: float
) -> float:
    """The ``context`` policy's score (lowest is evicted first)::

        importance·I + hits·log2(1 + H) + sharing·log2(1 + S) − size·log2(bytes / 1 KiB) − age·A

    I: importance in [0, 1] (untagged: 0.5); H: hit count, halved every ``hit_half_life`` turnovers; S:
    stored children (chains that continue through the block); A: turnovers since the last read or write,
    one turnover being as many store events as the store holds entries. Each point of score is worth one
    turnover of age: an entry of importance 1 outlives one of importance 0 stored at the same moment by
    ``weights.importance`` turnovers.
    """
    value = context_value(w, importance=importance, hits=hits, sharing=sharing, size=size)
    return value - w.age * age


class ContextPolicy:
    """Lowest :func:`context_score` first; ties by age."""

    name = "context"
    uses_meta = True

    def __init__(self, weights: ContextWeights | None = None) -> None:
        self.weights = weights or ContextWeights()

    def turnover(self, population: int) -> int:
        """Store events in one turnover: the population, at least ``min_turnover``."""
        return max(1, population, self.weights.min_turnover)

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
        turns = max(0, elapsed) / (self.turnover(population) * self.weights.hit_half_life)
        return float(hits * 2.0 ** (-turns))


def _ordered(value: float) -> bytes:
    """8 bytes that sort as the float does (sign bit flipped; negatives inverted)."""
    raw = bytearray(_DOUBLE.pack(value))
    if raw[0] & 0x80:
        return bytes(b ^ 0xFF for b in raw)
    raw[0] |= 0x80
    return bytes(raw)


__all__ = ["ContextPolicy", "context_score", "context_value"]
