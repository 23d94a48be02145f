"""Bit-level dtype conversions in numpy, which has no bfloat16 and slow float16 arithmetic.

Integer ufuncs with ``out=`` run at memory speed, so the hot conversions are done on raw bits:
bfloat16 -> float32 is a 16-bit left shift, finite float16 -> float32 a shift, a mask and an exact
multiplication by 2**112, and float32 -> bfloat16 an integer round-to-nearest-even. Everything here is
exact (or correctly rounded) so that the numpy and torch codecs produce identical bytes.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

_F16_TO_F32_MASK = np.int32(-0x7000_0001)  # 0x8FFFFFFF: keep the sign, drop sign-extension bits 28..30
_TWO_POW_112 = np.float32(2.0**112)  # rebias a float16 exponent placed in a float32
_BF16_HALF = np.uint32(0x7FFF)
_BF16_QUIET = np.uint16(0x0040)
_F16_SIGN = np.uint32(0x8000)
_HALF_ULP_13 = np.uint32(0xFFF)
F16_SCALED: Final = np.float32(2.0**-112)
"""What :func:`f16_bits_from_scaled` wants its values multiplied by."""


def f16_bits_to_f32_finite(bits: npt.NDArray[np.int16], out: npt.NDArray[np.float32]) -> None:
    """Widen float16 bits (viewed as ``int16``) to float32, exactly, for finite values only.

    inf/NaN come out as large finite numbers: callers must not use those rows (the int8 codec stores
    such groups raw). ``out`` must have the shape of ``bits``.
    """
    as_int = out.view(np.int32)
    np.left_shift(bits, 13, out=as_int, dtype=np.int32)
    np.bitwise_and(as_int, _F16_TO_F32_MASK, out=as_int)
    np.multiply(out, _TWO_POW_112, out=out)


def bf16_bits_to_f32(
    bits: npt.NDArray[Any], out: npt.NDArray[np.float32] | None = None
) -> npt.NDArray[np.float32]:
    """Widen bfloat16 bits (``uint16`` or ``int16``) to float32 exactly, inf and NaN included."""
    if out is None:
        out = np.empty(bits.shape, np.float32)
    np.left_shift(bits.view(np.int16), 16, out=out.view(np.int32), dtype=np.int32)
    return out


def f32_to_bf16_bits(
    values: npt.NDArray[np.float32],
    out: npt.NDArray[np.uint16] | None = None,
    *,
    finite: bool = False,
    scratch: npt.NDArray[np.uint32] | None = None,
) -> npt.NDArray[np.uint16]:
    """Round float32 to bfloat16 bits, to nearest even (as torch does). ``finite`` skips the NaN fix-up.

    ``scratch`` (``uint32``, the shape of ``values``) saves an allocation per call."""
    if out is None:
        out = np.empty(values.shape, np.uint16)
    word = np.asarray(values).view(np.uint32)
    tmp = np.empty_like(word) if scratch is None else scratch
    np.right_shift(word, 16, out=tmp)
    np.bitwise_and(tmp, 1, out=tmp)
    np.add(tmp, _BF16_HALF, out=tmp)
    np.add(tmp, word, out=tmp)
    np.right_shift(tmp, 16, out=tmp)
    np.copyto(out, tmp, casting="unsafe")
    if not finite:
        nan = np.isnan(values)
        if nan.any():
            # Rounding could carry a NaN's mantissa into the exponent (inf) or the sign: keep it a quiet NaN.
            out[nan] = (word[nan] >> 16).astype(np.uint16) | _BF16_QUIET
    return out


def f16_bits_from_scaled(
    scaled: npt.NDArray[np.float32],
    out: npt.NDArray[np.uint16],
    *,
    scratch: tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]],
) -> None:
    """float16 bits, rounded to nearest even, of ``v`` given ``scaled = v * 2**-112`` (float32).

    For ``v`` 0 or a normal float16 (2**-14 <= |v| <= 65504) this is exactly numpy's cast, at memory
    speed instead of one value at a time: scaled by 2**-112 a normal float16 has the float16 exponent
    bias in a normal float32, so rounding off 13 mantissa bits in integer arithmetic gives its bits (0
    stays 0). Anything else comes out wrong: callers check first. ``scaled`` is left changed; the two
    ``scratch`` arrays are ``uint32`` of its shape.
    """
    word = scaled.view(np.uint32)
    sign, odd = scratch
    np.right_shift(word, 16, out=sign)
    np.bitwise_and(sign, _F16_SIGN, out=sign)
    np.right_shift(word, 13, out=odd)
    np.bitwise_and(odd, 1, out=odd)
    np.add(odd, _HALF_ULP_13, out=odd)
    np.add(word, odd, out=word)  # the sign bit never receives a carry: |v| < 2**16
    np.right_shift(word, 13, out=word)  # bits 15..17 are 0, bit 18 the sign (dropped below)
    np.bitwise_or(word, sign, out=word)
    np.copyto(out, word, casting="unsafe")


def to_float32(
    values: npt.NDArray[Any], dtype: str, out: npt.NDArray[np.float32] | None = None
) -> npt.NDArray[np.float32]:
    """Stored values of ``dtype`` (bfloat16 as ``uint16`` bits) -> float32, exactly."""
    if dtype == "bfloat16":
        return bf16_bits_to_f32(values, out)
    if out is None:
        return values.astype(np.float32)
    np.copyto(out, values)
    return out


def from_float32(
    values: npt.NDArray[np.float32], dtype: str, out: npt.NDArray[Any] | None = None, *, finite: bool = False
) -> npt.NDArray[Any]:
    """float32 -> ``dtype`` storage (bfloat16 as ``uint16`` bits), rounding to nearest even."""
    if dtype == "bfloat16":
        return f32_to_bf16_bits(values, out, finite=finite)
    with np.errstate(over="ignore"):  # values beyond float16's range become inf, as IEEE says
        if out is None:
            return values.astype(dtype)
        np.copyto(out, values, casting="unsafe")
    return out


def convert(
    values: npt.NDArray[Any], src: str, dst: str, out: npt.NDArray[Any] | None = None
) -> npt.NDArray[Any]:
    """Stored values of dtype ``src`` -> storage of ``dst``; a copy of the bits when they are equal.

    With ``out`` (the shape of ``values``, storage of ``dst``) the result is written there and no
    intermediate array is made unless both dtypes are 16-bit (they meet in a float32 scratch).
    """
    if src == dst:
        if out is None:
            return values.copy()
        np.copyto(out, values)
        return out
    if dst == "float32":
        return to_float32(values, src, out)
    # from_float32 never writes its input, so float32 values need no widening copy
    wide = values if src == "float32" else to_float32(values, src)
    return from_float32(wide, dst, out)
