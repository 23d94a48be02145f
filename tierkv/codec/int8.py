"""Per-group absmax INT8 in numpy: the payload layout, the quantizer and the dequantizer.

Payload of an int8 blob (all little-endian), for ``N`` values (the C-order flattened array), group
size ``S`` and ``G = ceil(N / S)`` groups, group ``k`` holding values ``[k*S, min((k+1)*S, N))`` (only the
last group may be short)::

    group region, G records:     f32 scale | int8 q[len_k]          (4 * G + N bytes in all)
    exception table, only when header flag bit 0 is set:
                                 u32 count (>= 1)
                                 u32 group index[count]             (strictly ascending)
                                 raw values of those groups, in index order, in the blob dtype
                                 (float32 / float16 / bfloat16 bits), len_k values each

Quantization, in float32 arithmetic: ``scale = max|x| / 127`` (division, correctly rounded),
``q = clip(round_half_even(x / scale), -127, 127)``; an all-zero group has ``scale = 0`` and ``q = 0``
(dividing by 1 instead; a float32/bfloat16 group whose scale underflows to 0 decodes as zeros, an error
below 1e-44). A group holding inf or NaN is never quantized: its record is all zeros (scale 0, q 0)
and its exact values go to the exception table. So does a float32/bfloat16 group whose largest
magnitude is 2**127 or more, where ``q * scale`` could round past the largest finite float (see
``DTypeInfo``). Dequantization is ``q * scale`` in float32, then the exception groups are overwritten
with their raw values. The torch codec follows the same arithmetic to the bit, so both produce
identical blobs.

Speed: the group maxima are an integer max over the values' bits with the sign masked off (exact for
finite values; a maximum at or above ``DTypeInfo.raw_bits`` marks a group to keep raw), float16/bfloat16
are widened by bit shifts, and the work runs in chunks of ``CHUNK_VALUES`` values so that the float32
scratch stays in the L2 cache.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tierkv.codec.bits import (
    F16_SCALED,
    bf16_bits_to_f32,
    convert,
    f16_bits_from_scaled,
    f16_bits_to_f32_finite,
    f32_to_bf16_bits,
    from_float32,
)
from tierkv.codec.header import SCALE_BYTES, DTypeInfo, group_count, int8_groups_len
from tierkv.errors import CorruptBlobError

logger = logging.getLogger(__name__)

CHUNK_VALUES: Final = 1 << 18
"""Values quantized per step: 1 MiB of float32 scratch, which stays in a core's L2 cache."""
DECODE_CHUNK_VALUES: Final = 1 << 17
"""Values dequantized per step: 512 KiB of float32 and 1 MiB of integer scratch per thread, in L2."""
_F16_MAX: Final = 65504.0
_F16_MIN_NORMAL: Final = 2.0**-14
_LOCAL = threading.local()
QMAX: Final = 127
_QMAX_F32: Final = np.float32(QMAX)
_F32_TINY: Final = np.float32(np.finfo(np.float32).tiny)
_U32: Final = struct.Struct("<I")

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Int8Layout:
    """Geometry of the group region for ``value_count`` values in groups of ``group_size``."""

    value_count: int
    group_size: int

    @property
    def full_groups(self) -> int:
        return self.value_count // self.group_size

    @property
    def tail(self) -> int:
        """Values in the short last group (0 when the groups divide the values evenly)."""
        return self.value_count - self.full_groups * self.group_size

    @property
    def groups(self) -> int:
        return group_count(self.value_count, self.group_size)

    @property
    def groups_len(self) -> int:
        return int8_groups_len(self.value_count, self.group_size)

    @property
    def chunk_rows(self) -> int:
        return max(1, CHUNK_VALUES // self.group_size)

    def group_len(self, index: int) -> int:
        return min(self.group_size, self.value_count - index * self.group_size)

    def pieces(self) -> Iterator[tuple[int, int, int]]:
        """``(first group, groups, values per group)``: the full groups, then the short tail group."""
        if self.full_groups:
            yield 0, self.full_groups, self.group_size
        if self.tail:
            yield self.full_groups, 1, self.tail

    def parts(
        self, region: npt.NDArray[np.uint8]
    ) -> Iterator[tuple[int, npt.NDArray[np.float32], npt.NDArray[np.int8]]]:
        """Yield ``(first value, scales (n,), q (n, width))`` views of each of :meth:`pieces`."""
        offset = 0
        for first, n, width in self.pieces():
            records = region[offset : offset + n * (SCALE_BYTES + width)].reshape(n, SCALE_BYTES + width)
            yield (
                first * self.group_size,
                records[:, :SCALE_BYTES].view("<f4")[:, 0],
                records[:, SCALE_BYTES:].view(np.int8),
            )
            offset += n * (SCALE_BYTES + width)


def _amax_to_f32(amax_bits: npt.NDArray[Any], info: DTypeInfo) -> npt.NDArray[np.float32]:
    if info.name == "float16":
        return amax_bits.view(np.float16).astype(np.float32)
    if info.name == "bfloat16":
        return bf16_bits_to_f32(amax_bits)
    return amax_bits.view(np.float32).copy()


def _quantize_rows(
    src: npt.NDArray[Any],
    info: DTypeInfo,
    *,
    scales: npt.NDArray[np.float32],
    q: npt.NDArray[np.int8],
    abs_scratch: npt.NDArray[Any],
    f32_scratch: npt.NDArray[np.float32],
) -> npt.NDArray[np.bool_]:
    """Quantize ``src`` (n, width) into ``scales`` and ``q``; return the mask of rows to keep raw."""
    rows, width = src.shape
    bits = src.view(info.bits)
    magnitude = abs_scratch[: rows * width].reshape(rows, width)
    np.bitwise_and(bits, info.abs_mask, out=magnitude)
    amax = magnitude.max(axis=1)
    keep_raw = amax >= info.raw_bits
    any_keep_raw = bool(keep_raw.any())
    if any_keep_raw:
        amax[keep_raw] = 0
    scale = _amax_to_f32(amax, info)
    np.divide(scale, _QMAX_F32, out=scale)
    scales[:] = scale
    divisor = np.where(scale == 0, np.float32(1), scale)[:, None]
    x = f32_scratch[: rows * width].reshape(rows, width)
    if info.name == "float16":
        f16_bits_to_f32_finite(src.view(np.int16), x)
        np.divide(x, divisor, out=x)
    elif info.name == "bfloat16":
        bf16_bits_to_f32(src, x)
        np.divide(x, divisor, out=x)
    else:
        np.divide(src, divisor, out=x)
    if any_keep_raw:
        x[keep_raw] = 0
    np.rint(x, out=x)
    if ((scale > 0) & (scale < _F32_TINY)).any():
        # Only a subnormal scale is inexact enough for |x / scale| to round past 127.
        np.clip(x, -_QMAX_F32, _QMAX_F32, out=x)
    np.copyto(q, x, casting="unsafe")
    return np.asarray(keep_raw, dtype=np.bool_)


def quantize(
    values: npt.NDArray[Any], info: DTypeInfo, layout: Int8Layout, region: npt.NDArray[np.uint8]
) -> IntArray:
    """Fill the group region from the flat ``values`` (blob dtype storage); return the groups to keep raw."""
    rows = min(layout.chunk_rows, max(layout.full_groups, 1))
    scratch_values = max(rows * layout.group_size, layout.tail)
    abs_scratch = np.empty(scratch_values, info.bits)
    f32_scratch = np.empty(scratch_values, np.float32)
    found: list[IntArray] = []
    for start, scales, q in layout.parts(region):
        n, width = q.shape
        src = values[start : start + n * width].reshape(n, width)
        first_group = start // layout.group_size
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            keep_raw = _quantize_rows(
                src[r0:r1],
                info,
                scales=scales[r0:r1],
                q=q[r0:r1],
                abs_scratch=abs_scratch,
                f32_scratch=f32_scratch,
            )
            if keep_raw.any():
                found.append(np.flatnonzero(keep_raw) + (first_group + r0))
    return np.concatenate(found) if found else np.empty(0, np.int64)


def dequantize(region: npt.NDArray[np.uint8], layout: Int8Layout, out: npt.NDArray[Any], dtype: str) -> None:
    """Write ``q * scale`` of every group into the flat ``out`` (storage of ``dtype``).

    Cache-sized slices of rows are independent, so a large blob may be spread over threads
    (:func:`set_decode_threads`; numpy's ufuncs release the GIL); each thread keeps its own scratch.
    """
    rows = max(1, DECODE_CHUNK_VALUES // layout.group_size)
    slices: list[tuple[npt.NDArray[np.float32], npt.NDArray[np.int8], npt.NDArray[Any]]] = []
    for start, scales, q in layout.parts(region):
        n, width = q.shape
        dst = out[start : start + n * width].reshape(n, width)
        slices += [
            (scales[r0 : r0 + rows], q[r0 : r0 + rows], dst[r0 : r0 + rows]) for r0 in range(0, n, rows)
        ]
    if len(slices) > 1 and _THREADS.threads > 1:
        list(_THREADS.pool().map(lambda job: _dequantize_rows(job[0], job[1], job[2], dtype), slices))
    else:
        for scales, q, dst in slices:
            _dequantize_rows(scales, q, dst, dtype)


def _dequantize_rows(
    scales: npt.NDArray[np.float32], q: npt.NDArray[np.int8], dst: npt.NDArray[Any], dtype: str
) -> None:
    """``dst[i] = q[i] * scales[i]`` rounded to ``dtype``: widen once, scale in place, narrow once."""
    # Our encoder never writes scales that overflow; a foreign writer's blob decodes without warnings.
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "float32":
            # widen in place, then scale: faster than numpy's mixed int8 * float32 loop
            np.copyto(dst, q, casting="unsafe")
            np.multiply(dst, scales[:, None], out=dst)
            return
        x, bits, more = _scratch(q.size)
        x = x.reshape(q.shape)
        fast_f16 = dtype == "float16" and _normal_f16(scales)
        np.copyto(x, q, casting="unsafe")
        # 2**-112 is exact on the scales of a fast float16 slice (all >= 2**-14 or 0), and on each product
        np.multiply(x, (scales * F16_SCALED if fast_f16 else scales)[:, None], out=x)
        if dtype == "bfloat16":
            f32_to_bf16_bits(x, dst, finite=True, scratch=bits.reshape(q.shape))
        elif fast_f16:
            f16_bits_from_scaled(
                x, dst.view(np.uint16), scratch=(bits.reshape(q.shape), more.reshape(q.shape))
            )
        else:
            from_float32(x, dtype, out=dst, finite=True)


def _normal_f16(scales: npt.NDArray[np.float32]) -> bool:
    """Whether every ``q * scale`` (|q| <= 128) is 0 or a normal float16 (what the fast cast needs).

    True for every slice our encoder writes unless a group's largest value is below 127 * 2**-14 (~0.008)
    in magnitude; other slices take numpy's cast."""
    magnitude = np.abs(scales)
    if not float(magnitude.max(initial=0.0)) * 128 <= _F16_MAX:
        return False  # also for NaN
    return float(np.min(magnitude, where=magnitude > 0, initial=np.inf)) >= _F16_MIN_NORMAL


def _scratch(values: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """This thread's float32 and two uint32 scratch arrays of ``values`` values (kept between calls)."""
    have = getattr(_LOCAL, "f32", None)
    if have is None or have.size < values:
        size = max(values, DECODE_CHUNK_VALUES)
        _LOCAL.f32, _LOCAL.u32, _LOCAL.u32b = (np.empty(size, t) for t in (np.float32, np.uint32, np.uint32))
    return _LOCAL.f32[:values], _LOCAL.u32[:values], _LOCAL.u32b[:values]


class _DecodeThreads:
    """The thread count and the pool large blobs are dequantized on (created on first use)."""

    def __init__(self) -> None:
        self.threads = 1
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def set(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        with self._lock:
            old, self._pool, self.threads = self._pool, None, threads
        if old is not None:
            old.shutdown(wait=False)

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="tierkv-int8")
            return self._pool


_THREADS = _DecodeThreads()


def set_decode_threads(threads: int) -> None:
    """Dequantize large blobs on ``threads`` threads from now on (1, the default: on the caller's thread).

    More threads help only where cores are idle; on a busy machine they wait for each other (measure with
    ``benchmarks/codec_bench.py --decode-threads``). Meant for start-up, not while blobs are decoded.
    """
    _THREADS.set(threads)


def decode_threads() -> int:
    """The thread count :func:`set_decode_threads` set."""
    return _THREADS.threads


def gather_groups(values: npt.NDArray[Any], layout: Int8Layout, indices: IntArray) -> npt.NDArray[Any]:
    """The raw values of the listed groups, concatenated in index order."""
    g = layout.group_size
    return np.concatenate([values[int(i) * g : int(i) * g + layout.group_len(int(i))] for i in indices])


def pack_exceptions(indices: IntArray, raw: npt.NDArray[Any], info: DTypeInfo) -> bytes:
    """Serialize the exception table (see the module docstring)."""
    return b"".join(
        [
            _U32.pack(len(indices)),
            indices.astype("<u4").tobytes(),
            np.ascontiguousarray(raw, dtype=info.storage).tobytes(),
        ]
    )


def parse_exceptions(
    payload: npt.NDArray[np.uint8], layout: Int8Layout, info: DTypeInfo
) -> tuple[IntArray, npt.NDArray[Any]]:
    """Validate and view the exception table that follows the group region (empty when there is none)."""
    base = layout.groups_len
    if len(payload) == base:
        return np.empty(0, np.int64), np.empty(0, info.storage)
    if len(payload) < base + _U32.size:
        raise CorruptBlobError("int8 exception table truncated")
    (count,) = _U32.unpack_from(payload.data, base)
    index_end = base + _U32.size * (1 + count)
    if not 1 <= count <= layout.groups or len(payload) < index_end:
        raise CorruptBlobError(f"int8 exception table: bad count {count} for {layout.groups} groups")
    indices = payload[base + _U32.size : index_end].view("<u4").astype(np.int64)
    if indices[-1] >= layout.groups or (count > 1 and not (np.diff(indices) > 0).all()):
        raise CorruptBlobError("int8 exception table: group indices out of range or not ascending")
    short = layout.group_size - layout.tail if layout.tail and indices[-1] == layout.groups - 1 else 0
    raw_values = count * layout.group_size - short
    if len(payload) != index_end + raw_values * info.itemsize:
        raise CorruptBlobError(
            f"int8 exception table: {len(payload) - index_end} bytes for {raw_values} {info.name} values"
        )
    return indices, payload[index_end:].view(info.storage)


def restore_exceptions(
    out: npt.NDArray[Any], layout: Int8Layout, indices: IntArray, raw: npt.NDArray[Any], *, src: str, dst: str
) -> None:
    """Overwrite the exception groups of the flat ``out`` (storage of ``dst``) with their raw values."""
    g = layout.group_size
    pos = 0
    for index in indices:
        start = int(index) * g
        n = layout.group_len(int(index))
        convert(raw[pos : pos + n], src, dst, out=out[start : start + n])
        pos += n
