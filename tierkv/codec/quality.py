"""Error metrics for lossy codecs: how much a round trip changed the values."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from tierkv.errors import CodecError

logger = logging.getLogger(__name__)


def _pair(
    reference: npt.ArrayLike, decoded: npt.ArrayLike
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    ref = np.asarray(reference, dtype=np.float64).reshape(-1)
    dec = np.asarray(decoded, dtype=np.float64).reshape(-1)
    if ref.shape != dec.shape:
        raise CodecError(f"cannot compare {ref.size} values with {dec.size}")
    return ref, dec


def snr_db(reference: npt.ArrayLike, decoded: npt.ArrayLike) -> float:
    """Signal-to-noise ratio in dB: 10·log10(Σref² / Σ(ref−dec)²); +inf for an exact copy.

    Non-finite positions must agree exactly (inf with inf of the same sign, NaN with NaN) and are left out
    of the sums; a disagreement there is infinitely bad, so it returns -inf.
    """
    ref, dec = _pair(reference, decoded)
    finite = np.isfinite(ref)
    if not _nonfinite_agree(ref[~finite], dec[~finite]):
        return -math.inf
    ref, dec = ref[finite], dec[finite]
    noise = float(np.sum((ref - dec) ** 2))
    signal = float(np.sum(ref**2))
    if not math.isfinite(noise):
        return -math.inf
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def max_abs_error(reference: npt.ArrayLike, decoded: npt.ArrayLike) -> float:
    """Largest |ref − dec| over finite reference values; +inf if non-finite positions disagree."""
    ref, dec = _pair(reference, decoded)
    finite = np.isfinite(ref)
    if not _nonfinite_agree(ref[~finite], dec[~finite]):
        return math.inf
    if not finite.any():
        return 0.0
    err = float(np.max(np.abs(ref[finite] - dec[finite])))
    return err if not math.isnan(err) else math.inf


def _nonfinite_agree(ref: npt.NDArray[Any], dec: npt.NDArray[Any]) -> bool:
    same_inf = ref == dec
    both_nan = np.isnan(ref) & np.isnan(dec)
    return bool(np.all(same_inf | both_nan))
