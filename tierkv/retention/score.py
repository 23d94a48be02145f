"""The ``context`` score, shared by the vault's ``context`` policy and the in-process hot tier of the
transformers hook, so that an entry is worth the same in both (plain arithmetic: no store, no engine).

Weights come from ``[retention.weights]`` (:class:`~tierkv.config.ContextWeights`); any object with the
same fields will do, which keeps this module below the configuration layer.
"""

from __future__ import annotations

import math
from typing import Protocol


class Weights(Protocol):
    """The fields of ``[retention.weights]`` the score reads."""

    @property
    def importance(self) -> float: ...
    @property
    def hits(self) -> float: ...
    @property
    def sharing(self) -> float: ...
    @property
    def size(self) -> float: ...
    @property
    def age(self) -> float: ...
    @property
    def hit_half_life(self) -> float: ...
    @property
    def min_turnover(self) -> int: ...


def context_value(w: Weights, *, importance: float, hits: float, sharing: int, size: int) -> float:
    """The part of the score that does not age: what the entry is worth, in turnovers of credit."""
    return (
        w.importance * importance
        + w.hits * math.log2(1.0 + max(0.0, hits))
        + w.sharing * math.log2(1.0 + max(0, sharing))
        - w.size * math.log2(max(1, size) / 1024)
    )


def context_score(
    w: Weights, *, importance: float, hits: float, sharing: int, size: int, age: float
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


def turnover(w: Weights, population: int) -> int:
    """Store events in one turnover: the population, at least ``min_turnover``."""
    return max(1, population, w.min_turnover)


def decayed_hits(w: Weights, hits: float, elapsed: int, population: int) -> float:
    """``hits`` after ``elapsed`` clock ticks: halved every ``hit_half_life`` turnovers."""
    turns = max(0, elapsed) / (turnover(w, population) * w.hit_half_life)
    return float(hits * 2.0 ** (-turns))


__all__ = ["Weights", "context_score", "context_value", "decayed_hits", "turnover"]
