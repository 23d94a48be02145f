"""The sliced, threaded int8 decoder and its integer float16 cast give the bytes of the decoder they replace.

``reference_dequantize`` is the previous decoder, kept verbatim as the oracle: one float32 product per
value, narrowed by numpy's own cast (float16) or :func:`f32_to_bf16_bits` (bfloat16). Scales are drawn
from every float32 bit pattern (NaN, inf, subnormal, negative, huge: what a foreign writer could send)
as well as from what our encoder writes, so both the fast float16 path and its fallback are covered.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.codec import decode, encode, int8
from tierkv.codec.bits import F16_SCALED, f16_bits_from_scaled, f32_to_bf16_bits, from_float32
from tierkv.codec.blob import open_blob
from tierkv.codec.header import SCALE_BYTES

DTYPES = ["float32", "float16", "bfloat16"]


def reference_dequantize(
    region: npt.NDArray[np.uint8], layout: int8.Int8Layout, out: npt.NDArray[Any], dtype: str
) -> None:
    """The decoder before slicing and the float16 integer cast (tierkv 0.1), unchanged."""
    rows = min(layout.chunk_rows, max(layout.full_groups, 1))
    scratch = None if dtype == "float32" else np.empty(max(rows * layout.group_size, layout.tail), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for start, scales, q in layout.parts(region):
            n, width = q.shape
            dst = out[start : start + n * width].reshape(n, width)
            for r0 in range(0, n, rows):
                r1 = min(n, r0 + rows)
                if scratch is None:
                    np.copyto(dst[r0:r1], q[r0:r1], casting="unsafe")
                    np.multiply(dst[r0:r1], scales[r0:r1, None], out=dst[r0:r1])
                else:
                    tmp = scratch[: (r1 - r0) * width].reshape(r1 - r0, width)
                    np.copyto(tmp, q[r0:r1], casting="unsafe")
                    np.multiply(tmp, scales[r0:r1, None], out=tmp)
                    from_float32(tmp, dtype, out=dst[r0:r1], finite=True)


def region_of(layout: int8.Int8Layout, scales: npt.NDArray[np.float32], q: npt.NDArray[np.int8]) -> Any:
    """A group region holding ``scales`` (one per group) and ``q`` (one per value)."""
    region = np.empty(layout.groups_len, np.uint8)
    offset = 0
    for first, n, width in layout.pieces():
        records = region[offset : offset + n * (SCALE_BYTES + width)].reshape(n, SCALE_BYTES + width)
        records[:, :SCALE_BYTES] = (
            scales[first : first + n].astype("<f4").view(np.uint8).reshape(n, SCALE_BYTES)
        )
        records[:, SCALE_BYTES:] = (
            q[first * layout.group_size : first * layout.group_size + n * width]
            .reshape(n, width)
            .view(np.uint8)
        )
        offset += n * (SCALE_BYTES + width)
    return region


@pytest.fixture(params=[1, 3], ids=["x1", "x3"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    int8.set_decode_threads(request.param)
    yield request.param
    int8.set_decode_threads(1)


def both(region: Any, layout: int8.Int8Layout, dtype: str) -> tuple[bytes, bytes]:
    storage = np.float32 if dtype == "float32" else np.uint16 if dtype == "bfloat16" else np.float16
    new = np.empty(layout.value_count, storage)
    old = np.empty(layout.value_count, storage)
    int8.dequantize(region, layout, new, dtype)
    reference_dequantize(region, layout, old, dtype)
    return new.tobytes(), old.tobytes()


scale_bits = st.integers(0, 2**32 - 1).map(lambda b: np.uint32(b).view(np.float32))
real_scales = (
    st.floats(2.0**-14, 65504 / 128, width=32) | st.floats(2.0**-30, 2.0**-14, width=32) | st.just(0.0)
)


@settings(max_examples=150, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    group=st.integers(1, 200),
    values=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
    scales=st.lists(scale_bits | real_scales, min_size=1, max_size=8),
)
def test_any_region_decodes_to_the_reference_bytes(
    dtype: str, group: int, values: int, seed: int, scales: list[float]
) -> None:
    layout = int8.Int8Layout(values, group)
    rng = np.random.default_rng(seed)
    q = rng.integers(-128, 128, values, dtype=np.int8)
    picked = np.asarray(scales, np.float32)[rng.integers(0, len(scales), layout.groups)]
    new, old = both(region_of(layout, picked, q), layout, dtype)
    assert new == old


SPECIAL_SCALES = [
    1.0,
    0.0,
    -0.0,
    -2.5,
    2.0**-14,
    65504 / 128,
    65504 / 127,
    1e6,
    np.inf,
    -np.inf,
    np.nan,
    1e-42,
]
TIE_BELOW_F16_NORMAL = float(np.float32((2**23 + 2**12 + 1) * 2.0**-38))
"""A scale under 2**-14 whose last bit decides how 2 * scale rounds to float16 (a tie without it)."""


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "scale",
    [*SPECIAL_SCALES, 2.0**-20, TIE_BELOW_F16_NORMAL],
)
def test_special_scales_decode_to_the_reference_bytes(dtype: str, scale: float) -> None:
    """Scales a foreign writer could send, around every bound the float16 fast path checks."""
    q = np.array([2, -128, 127, 0, 1, -1, 64, -77], np.int8)
    layout = int8.Int8Layout(q.size, 4)
    region = region_of(layout, np.array([scale, 1.0], np.float32), q)
    new, old = both(region, layout, dtype)
    assert new == old


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (32, 2, 8, 16, 128), (1 << 18) + 77])
def test_encoded_blobs_decode_to_the_reference_bytes(dtype: str, shape: Any, threads: int) -> None:
    """Many slices (and threads), exception groups and float16 fallbacks: all as the reference does."""
    x32 = np.asarray(np.random.default_rng(3).standard_normal(shape) * 4, np.float32)
    x32.reshape(-1)[: 64 * 3] *= 1e-4  # groups of tiny values (float16 subnormals) take numpy's cast
    x = f32_to_bf16_bits(x32) if dtype == "bfloat16" else x32.astype(dtype)
    x.reshape(-1)[5] = 0x7F80 if dtype == "bfloat16" else np.inf
    blob = encode(x, "int8", dtype="bfloat16" if dtype == "bfloat16" else None, group_size=64)
    _, got = decode(blob, out_dtype=dtype)
    header, payload = open_blob(blob)
    layout = int8.Int8Layout(header.value_count, header.group_size)
    ref = np.empty(x.size, got.dtype)
    reference_dequantize(payload[: layout.groups_len], layout, ref, dtype)
    indices, raw = int8.parse_exceptions(payload, layout, header.dtype_info)
    assert indices.size == 1
    int8.restore_exceptions(ref, layout, indices, raw, src=dtype, dst=dtype)
    assert got.tobytes() == ref.tobytes()


def test_float16_cast_matches_numpy_on_every_normal_value_and_tie() -> None:
    """Every finite float16 that is 0 or normal, its float32 neighbours, and every tie between two."""
    h = np.arange(1 << 16, dtype=np.uint16)
    magnitude = h & 0x7FFF
    normal = h[((magnitude >= 0x0400) & (magnitude < 0x7C00)) | (magnitude == 0)]
    exact = normal.view(np.float16).astype(np.float32)
    bits = exact.view(np.uint32)
    ties = bits[exact != 0] + np.uint32(1 << 12)  # halfway to the next float16 up
    probes = np.concatenate([bits, bits + 1, bits - 1, ties, ties - 1, ties + 1]).view(np.float32)
    probes = probes[np.isfinite(probes) & ((np.abs(probes) >= 2.0**-14) | (probes == 0))]
    probes = probes[np.abs(probes) <= 65504]
    expected = probes.astype(np.float16).view(np.uint16)
    got = np.empty(probes.shape, np.uint16)
    scaled = probes * F16_SCALED
    f16_bits_from_scaled(
        scaled, got, scratch=(np.empty(probes.shape, np.uint32), np.empty(probes.shape, np.uint32))
    )
    assert np.array_equal(got, expected)


def test_decode_threads_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threads"):
        int8.set_decode_threads(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("into", ["new", "contiguous", "strided"])
def test_torch_decode_of_many_steps_gives_the_numpy_bytes(dtype: str, into: str) -> None:
    """Blobs several of torch's CPU steps long (and a short last group) decode as numpy decodes them."""
    torch = pytest.importorskip("torch")
    from tierkv.codec.torch_codec import CPU_DECODE_VALUES, TORCH_DTYPES, decode_tensor, numpy_view

    values = 2 * CPU_DECODE_VALUES + 77
    x32 = np.asarray(np.random.default_rng(5).standard_normal(values) * 3, np.float32)
    x = f32_to_bf16_bits(x32) if dtype == "bfloat16" else x32.astype(dtype)
    blob = encode(x, "int8", dtype="bfloat16" if dtype == "bfloat16" else None, group_size=96)
    _, expected = decode(blob, out_dtype=dtype)
    target = TORCH_DTYPES[dtype]
    out = None
    if into == "contiguous":
        out = torch.empty(values, dtype=target)
    elif into == "strided":
        out = torch.empty(2 * values, dtype=target)[::2]
    _, got = decode_tensor(blob, dtype=target, out=out)
    assert numpy_view(got.contiguous()).tobytes() == expected.tobytes()
