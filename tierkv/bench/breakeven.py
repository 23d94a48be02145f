"""When does a restore beat recomputing? Pure arithmetic on measured rates, no I/O.

Prefill time grows superlinearly with prompt length on real models: the matrix products are linear in
the number of tokens, attention is quadratic. :class:`PrefillModel` is ``t(n) = a·n + b·n²``, either
fitted to prefill times measured at two or more lengths (the better model), or linear from one rate in
tokens/s (``b = 0``; honest only near the length where the rate was measured, and pessimistic for
tiering at longer prompts). :class:`RestoreModel` is ``t(n) = c + r·n``: a fixed cost per restore
(lookup round trip, request set-up) plus the KV bytes of ``n`` tokens over the measured throughput.

The break-even length is the smallest ``n`` with ``restore(n) < prefill(n)``; the savings at 8k, 32k and
128k tokens are ``prefill(n) - restore(n)`` (extrapolated when the measurements stopped short of them).

Measured time-to-first-token contains a cost both paths pay alike (the request itself, computing the
last prompt token, sampling). It does not move the break-even point but bends a fit through the origin,
so runners subtract it (the TTFT of a hot hit is a good estimate) before fitting and pass it back as
``common_s``: the times shown at 8k/32k/128k then include it again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

SAVINGS_AT: tuple[int, ...] = (8192, 32768, 131072)


def _check_points(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    pts = [(float(n), float(t)) for n, t in points]
    if not pts:
        raise ValueError("need at least one (tokens, seconds) measurement")
    for n, t in pts:
        if not (n > 0 and t > 0 and math.isfinite(n) and math.isfinite(t)):
            raise ValueError(f"measurements need positive tokens and seconds, got ({n}, {t})")
    return pts


@dataclasses.dataclass(frozen=True)
class PrefillModel:
    """``seconds(n) = a·n + b·n²``; ``basis`` says in words where the coefficients came from."""

    a: float
    b: float = 0.0
    basis: str = ""

    def __post_init__(self) -> None:
        if self.a < 0 or self.b < 0 or (self.a == 0 and self.b == 0):
            raise ValueError(f"prefill model needs a, b >= 0, not both zero (a={self.a}, b={self.b})")

    @classmethod
    def from_rate(cls, tokens_per_s: float, measured_at: int | None = None) -> PrefillModel:
        """Linear: ``n / tokens_per_s``. Say at which length the rate was measured, if known."""
        if not tokens_per_s > 0:
            raise ValueError(f"prefill rate must be positive, got {tokens_per_s}")
        where = f" measured at {measured_at} tokens" if measured_at else ""
        return cls(1.0 / tokens_per_s, 0.0, f"linear, {tokens_per_s:,.0f} tokens/s{where}")

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> PrefillModel:
        """Least squares of ``a·n + b·n²`` (through the origin) on measured ``(tokens, seconds)``.

        One length gives a linear model. A fit whose ``b`` or ``a`` comes out negative (noise on
        lengths too close together) falls back to the best line through the origin.
        """
        pts = _check_points(points)
        lengths = sorted({int(n) for n, _ in pts})
        linear_a = sum(n * t for n, t in pts) / sum(n * n for n, _ in pts)
        linear = cls(
            linear_a, 0.0, f"linear fit to {_lengths(lengths)} tokens ({1 / linear_a:,.0f} tokens/s)"
        )
        if len(lengths) < 2:
            return linear
        s2 = sum(n**2 for n, _ in pts)
        s3 = sum(n**3 for n, _ in pts)
        s4 = sum(n**4 for n, _ in pts)
        t1 = sum(n * t for n, t in pts)
        t2 = sum(n * n * t for n, t in pts)
        det = s2 * s4 - s3 * s3
        if det <= 0:
            return linear
        a = (t1 * s4 - t2 * s3) / det
        b = (s2 * t2 - s3 * t1) / det
        if a < 0 or b < 0:
            logger.info("quadratic prefill fit gave a=%g b=%g; using a line through the origin", a, b)
            return linear
        return cls(a, b, f"a·n + b·n² fitted to {_lengths(lengths)} tokens")

    def seconds(self, tokens: float) -> float:
        return self.a * tokens + self.b * tokens * tokens

    def rate_at(self, tokens: float) -> float:
        """Average prefill rate (tokens/s) for a prompt of ``tokens``."""
        return tokens / self.seconds(tokens)

    def as_dict(self) -> dict[str, Any]:
        return {"a_s_per_token": self.a, "b_s_per_token2": self.b, "basis": self.basis}


@dataclasses.dataclass(frozen=True)
class RestoreModel:
    """``seconds(n) = fixed_s + per_token_s·n``; ``bytes_per_token`` is kept to show throughput."""

    fixed_s: float
    per_token_s: float
    bytes_per_token: float | None = None
    basis: str = ""

    def __post_init__(self) -> None:
        if self.fixed_s < 0 or self.per_token_s < 0:
            raise ValueError(f"restore model needs non-negative terms, got {self}")

    @classmethod
    def from_throughput(
        cls, bytes_per_s: float, bytes_per_token: float, fixed_s: float = 0.0, basis: str = ""
    ) -> RestoreModel:
        if not (bytes_per_s > 0 and bytes_per_token > 0):
            raise ValueError("restore throughput and bytes per token must be positive")
        return cls(fixed_s, bytes_per_token / bytes_per_s, bytes_per_token, basis)

    @classmethod
    def fit(
        cls,
        points: Sequence[tuple[float, float]],
        bytes_per_token: float | None = None,
        what: str = "restore",
    ) -> RestoreModel:
        """Least squares line on measured ``(tokens, seconds)``; the intercept is clamped at zero.

        One length (or a negative slope) gives a line through the origin and that point.
        """
        pts = _check_points(points)
        lengths = sorted({int(n) for n, _ in pts})
        origin = sum(n * t for n, t in pts) / sum(n * n for n, _ in pts)
        if len(lengths) >= 2:
            mean_n = sum(n for n, _ in pts) / len(pts)
            mean_t = sum(t for _, t in pts) / len(pts)
            sxx = sum((n - mean_n) ** 2 for n, _ in pts)
            slope = sum((n - mean_n) * (t - mean_t) for n, t in pts) / sxx
            intercept = mean_t - slope * mean_n
            if slope > 0:
                if intercept < 0:
                    return cls(
                        0.0,
                        origin,
                        bytes_per_token,
                        f"line through the origin, {what} at {_lengths(lengths)}",
                    )
                return cls(
                    intercept, slope, bytes_per_token, f"c + r·n fitted to {what} at {_lengths(lengths)}"
                )
        return cls(0.0, origin, bytes_per_token, f"line through the origin, {what} at {_lengths(lengths)}")

    def seconds(self, tokens: float) -> float:
        return self.fixed_s + self.per_token_s * tokens

    @property
    def tokens_per_s(self) -> float:
        return math.inf if self.per_token_s == 0 else 1.0 / self.per_token_s

    @property
    def bytes_per_s(self) -> float | None:
        if self.bytes_per_token is None or self.per_token_s == 0:
            return None
        return self.bytes_per_token / self.per_token_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "fixed_s": self.fixed_s,
            "per_token_s": self.per_token_s,
            "tokens_per_s": self.tokens_per_s,
            "bytes_per_token": self.bytes_per_token,
            "bytes_per_s": self.bytes_per_s,
            "basis": self.basis,
        }


@dataclasses.dataclass(frozen=True)
class Saving:
    tokens: int
    prefill_s: float
    restore_s: float

    @property
    def saved_s(self) -> float:
        return self.prefill_s - self.restore_s

    @property
    def speedup(self) -> float:
        return self.prefill_s / self.restore_s if self.restore_s > 0 else math.inf

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "prefill_s": self.prefill_s,
            "restore_s": self.restore_s,
            "saved_s": self.saved_s,
            "speedup": self.speedup,
        }


@dataclasses.dataclass(frozen=True)
class BreakEven:
    """``tokens``: shortest prompt a restore beats recomputing; None when it never does."""

    prefill: PrefillModel
    restore: RestoreModel
    tokens: int | None
    savings: tuple[Saving, ...]
    common_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "common_s": self.common_s,
            "prefill_model": self.prefill.as_dict(),
            "restore_model": self.restore.as_dict(),
            "savings": [s.as_dict() for s in self.savings],
        }


def crossover(prefill: PrefillModel, restore: RestoreModel) -> float | None:
    """The real ``n* >= 0`` beyond which ``prefill(n) > restore(n)``; None if that never happens.

    ``prefill(n) - restore(n) = b·n² + (a - r)·n - c``, zero at ``n = 0`` or below when ``c >= 0``, so it
    has at most one positive root: with ``b > 0`` it always exists; with ``b = 0`` only if ``a > r``.
    """
    a, b = prefill.a, prefill.b
    r, c = restore.per_token_s, restore.fixed_s
    if b > 0:
        k = a - r
        return (-k + math.sqrt(k * k + 4.0 * b * c)) / (2.0 * b)
    if a > r:
        return c / (a - r)
    return None


def break_even(
    prefill: PrefillModel, restore: RestoreModel, at: Sequence[int] = SAVINGS_AT, common_s: float = 0.0
) -> BreakEven:
    """Break-even length and savings; ``common_s`` (paid by both paths) is added to the times shown."""
    if common_s < 0:
        raise ValueError(f"common_s must be >= 0, got {common_s}")
    n_star = crossover(prefill, restore)
    tokens = None if n_star is None else max(1, math.floor(n_star) + 1)
    savings = tuple(Saving(n, prefill.seconds(n) + common_s, restore.seconds(n) + common_s) for n in at)
    return BreakEven(prefill, restore, tokens, savings, common_s)


def net_of(
    points: Sequence[tuple[float, float]], common_s: float, floor_s: float = 1e-6
) -> list[tuple[float, float]]:
    """``(tokens, seconds - common_s)``, kept positive (noise can put a measurement below the baseline)."""
    return [(n, max(floor_s, t - common_s)) for n, t in points]


def ttft_break_even(
    prefill: Sequence[tuple[float, float]],
    restore: Sequence[tuple[float, float]],
    common_s: float,
    *,
    bytes_per_token: float | None = None,
    what: str = "restored TTFT",
) -> BreakEven:
    """Break-even from measured ``(tokens, TTFT)`` of prefills and of restores.

    Both are fitted net of ``common_s`` (what every request pays alike; the hot-hit TTFT), which comes
    back in the savings shown.
    """
    prefill_model = PrefillModel.fit(net_of(prefill, common_s))
    restore_model = RestoreModel.fit(net_of(restore, common_s), bytes_per_token=bytes_per_token, what=what)
    return break_even(prefill_model, restore_model, common_s=common_s)


def _lengths(lengths: Sequence[int]) -> str:
    return ", ".join(f"{n:,}" for n in lengths)


__all__ = [
    "SAVINGS_AT",
    "BreakEven",
    "PrefillModel",
    "RestoreModel",
    "Saving",
    "break_even",
    "crossover",
    "net_of",
    "ttft_break_even",
]
