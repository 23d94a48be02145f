"""Round trips of the numpy codecs: every dtype, odd lengths, int8 arithmetic and error bounds."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tierkv.codec import (
    CODECS,
    FLAG_EXCEPTIONS,
    LayerGroup,
    decode,
    encode,
    max_abs_error,
    read_header,
    snr_db,
    verify,
)
from tierkv.codec.bits import bf16_bits_to_f32, f32_to_bf16_bits
from tierkv.errors import CodecError

DTYPES = ["float32", "float16", "bfloat16"]


def make(shape: tuple[int, ...], dtype: str, seed: int = 0, scale: float = 3.0) -> npt.NDArray[Any]:
    """Gaussian values in blob storage: bfloat16 as uint16 bits (rounded to nearest even)."""
    x = np.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, np.float32)
    if dtype == "bfloat16":
        return f32_to_bf16_bits(x)
    return np.asarray(x.astype(dtype))


def as_f32(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.float32]:
    if dtype == "bfloat16":
        return bf16_bits_to_f32(values)
    return values.astype(np.float32)


def kw(dtype: str) -> dict[str, Any]:
    return {"dtype": "bfloat16"} if dtype == "bfloat16" else {}


def reference_int8(x: npt.NDArray[np.float32], group: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """The documented arithmetic, written the slow obvious way (finite inputs)."""
    flat = x.reshape(-1)
    scales, qs = [], []
    for start in range(0, flat.size, group):
        g = flat[start : start + group]
        scale = np.float32(np.max(np.abs(g))) / np.float32(127)
        divisor = scale if scale != 0 else np.float32(1)
        qs.append(np.clip(np.rint(g / divisor), -127, 127).astype(np.int8))
        scales.append(scale)
    return np.array(scales, np.float32), np.concatenate(qs) if qs else np.empty(0, np.int8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(4, 2, 2, 16, 64), (3, 5, 7), (1,), (129,), (2, 0, 8), (0,), (), (1000, 3)]
)
def test_raw_round_trip_is_bit_exact(dtype: str, shape: tuple[int, ...]) -> None:
    x = make(shape, dtype)
    blob = encode(x, "raw", tokens=16, layer_group=LayerGroup.SLIDING, **kw(dtype))
    header, y = decode(blob)
    assert header.codec == "raw" and header.dtype == dtype and header.shape == shape
    assert header.tokens == 16 and header.layer_group is LayerGroup.SLIDING
    assert header.group_size == 0 and header.flags == 0
    assert y.dtype == x.dtype and y.shape == shape
    assert y.tobytes() == x.tobytes()
    assert len(blob) == header.header_len + x.nbytes  # no upcast on the wire


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "group"),
    [
        ((4, 2, 2, 16, 64), None),
        ((1000,), 128),
        ((129,), 128),
        ((1,), 128),
        ((7, 9), 4),
        ((0,), 8),
        ((), None),
    ],
)
def test_int8_matches_the_documented_arithmetic(
    dtype: str, shape: tuple[int, ...], group: int | None
) -> None:
    x = make(shape, dtype, seed=len(shape))
    blob = encode(x, "int8", group_size=group, **kw(dtype))
    header, y = decode(blob)
    g = group if group is not None else (shape[-1] if shape else 1)
    assert header.group_size == g and header.value_count == x.size and header.shape == shape
    assert y.dtype == np.float32 and y.shape == shape
    scales, q = reference_int8(as_f32(x, dtype), g)
    expected = (
        np.concatenate([(q[i * g : (i + 1) * g].astype(np.float32) * scales[i]) for i in range(len(scales))])
        if len(scales)
        else np.empty(0, np.float32)
    )
    assert np.array_equal(y.reshape(-1), expected)
    assert header.payload_len == 4 * len(scales) + x.size  # short last group stored short


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_error_is_within_half_a_step_per_group(dtype: str) -> None:
    x = make((64, 128), dtype, seed=7, scale=10.0)
    _, y = decode(encode(x, "int8", **kw(dtype)))
    ref = as_f32(x, dtype)
    step = np.abs(ref).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(ref - y) <= step * (0.5 + 1e-5))


def test_gaussian_fp16_group128_snr_at_least_40_db() -> None:
    x = make((256, 128), "float16", seed=3, scale=1.0)
    _, y = decode(encode(x, "int8", group_size=128))
    assert snr_db(x, y) >= 40.0
    assert max_abs_error(x, y) <= float(np.abs(x.astype(np.float32)).max()) / 254 * 1.001


def test_all_zero_group_has_zero_scale_and_decodes_to_zero() -> None:
    x = np.zeros((3, 16), np.float16)
    x[1] = np.linspace(-1, 1, 16)
    blob = encode(x, "int8")
    header = read_header(blob)
    payload = np.frombuffer(blob, np.uint8, offset=header.header_len)
    assert payload[:20].tobytes() == bytes(20)  # scale 0.0, q all 0
    _, y = decode(blob)
    assert not y[0].any() and not y[2].any()
    assert np.allclose(y[1], x[1], atol=1 / 254)


def test_tiny_float32_values_never_exceed_127_steps() -> None:
    x = np.array([1e-42, -3e-43, 2e-44, 0.0] * 8, np.float32)  # subnormal scales
    _, y = decode(encode(x, "int8", group_size=8))
    assert np.all(np.abs(y - x) <= np.abs(x).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 5, 128])
def test_non_finite_groups_round_trip_exactly(dtype: str, group: int) -> None:
    n = 3 * 128 + 37  # short last group for every group size above 1
    x = make((n,), dtype, seed=11)
    specials = np.array([np.inf, -np.inf, np.nan], np.float32)
    positions = [0, 200, n - 1]  # first group, a middle one, the short tail
    if dtype == "bfloat16":
        x[positions] = f32_to_bf16_bits(specials)
    else:
        x[positions] = specials.astype(dtype)
    blob = encode(x, "int8", group_size=group, **kw(dtype))
    header = verify(blob)
    assert header.flags & FLAG_EXCEPTIONS
    _, back = decode(blob, out_dtype=dtype)
    hit = sorted({p // group for p in positions})
    for g in hit:
        sl = slice(g * group, min((g + 1) * group, n))
        assert back[sl].tobytes() == x[sl].tobytes(), f"group {g} not restored bit-exactly"
    _, y = decode(blob)
    f = as_f32(x, dtype)
    assert np.isposinf(y[0]) and np.isneginf(y[200]) and np.isnan(y[n - 1])
    finite = np.ones(n, bool)
    for g in hit:
        finite[g * group : (g + 1) * group] = False
    assert np.all(np.abs(f[finite] - y[finite]) <= np.abs(f[finite]).max() / 127)


def test_clean_blob_has_no_exception_flag() -> None:
    blob = encode(make((4, 64), "float16"), "int8")
    assert read_header(blob).flags == 0


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("codec", ["raw", "int8"])
@pytest.mark.parametrize("dst", DTYPES)
def test_out_dtype_conversions(src: str, codec: str, dst: str) -> None:
    x = make((5, 33), src, seed=5)
    _, y32 = decode(encode(x, codec, **kw(src)), out_dtype="float32")
    _, y = decode(encode(x, codec, **kw(src)), out_dtype=dst)
    assert y.dtype == (np.uint16 if dst == "bfloat16" else np.dtype(dst))
    expected = f32_to_bf16_bits(y32) if dst == "bfloat16" else y32.astype(dst)
    assert y.tobytes() == expected.tobytes()


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("codec", ["raw", "int8"])
@pytest.mark.parametrize("dst", DTYPES)
def test_decode_into_out_gives_the_bytes_of_a_fresh_decode(src: str, codec: str, dst: str) -> None:
    x = make((6, 33), src, seed=9)
    x[1, 4], x[4, 0] = (0x7F80, 0x7FC1) if src == "bfloat16" else (np.inf, np.nan)  # int8 keeps these raw
    blob = encode(x, codec, group_size=16, **kw(src))
    _, fresh = decode(blob, out_dtype=dst)
    out = np.full(x.shape, 0x5A5A if dst == "bfloat16" else np.nan, fresh.dtype)
    _, got = decode(blob, out_dtype=dst, out=out)
    assert got is out and out.tobytes() == fresh.tobytes()
    with pytest.raises(CodecError, match="out is"):  # byte-swapped storage is not the storage dtype
        decode(blob, out_dtype=dst, out=np.empty(x.shape, fresh.dtype.newbyteorder(">")))


def test_decode_into_out_and_zero_copy_view() -> None:
    x = make((8, 64), "float16")
    blob = encode(x, "int8")
    out = np.full((8, 64), np.nan, np.float32)
    _, y = decode(blob, out=out)
    assert y is out and np.array_equal(out, decode(blob)[1])
    with pytest.raises(CodecError):
        decode(blob, out=np.empty((8, 64), np.float16))
    with pytest.raises(CodecError):
        decode(blob, out=np.empty((64, 8), np.float32))
    raw = encode(x, "raw")
    _, view = decode(raw, copy=False)
    assert not view.flags.writeable and np.shares_memory(view, np.frombuffer(raw, np.uint8))
    _, owned = decode(raw)
    assert owned.flags.writeable and not np.shares_memory(owned, np.frombuffer(raw, np.uint8))


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8)])
def test_decode_accepts_any_bytes_like(wrap: Any) -> None:
    x = make((4, 32), "bfloat16")
    blob = encode(x, "int8", dtype="bfloat16")
    header, y = decode(wrap(blob))
    assert header.dtype == "bfloat16" and np.array_equal(y, decode(blob)[1])
    framed = b"xx" + blob + b"yy"
    _, z = decode(memoryview(framed)[2:-2])
    assert np.array_equal(z, y)


def test_noncontiguous_and_big_endian_inputs_encode_like_their_copies() -> None:
    x = make((16, 64), "float32")
    view = x[:, ::2]
    assert encode(view, "int8") == encode(np.ascontiguousarray(view), "int8")
    assert encode(x.astype(">f4"), "raw") == encode(x, "raw")


def test_encode_rejects_bad_arguments() -> None:
    x = make((4, 8), "float16")
    with pytest.raises(CodecError):
        encode(x, "zstd")
    with pytest.raises(CodecError):
        encode(x, "int8", group_size=0)
    with pytest.raises(CodecError):
        encode(x, tokens=-1)
    with pytest.raises(CodecError):
        encode(x, layer_group=9)  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        encode(x.astype(np.float64))
    with pytest.raises(CodecError):
        encode(x.view(np.uint16))  # bfloat16 bits must be declared
    with pytest.raises(CodecError):
        encode(x, dtype="bfloat16")  # float16 values are not bfloat16 bits
    with pytest.raises(CodecError):
        encode(x, dtype="float32")
    with pytest.raises(CodecError):
        encode(x.tolist())


def test_registries() -> None:
    assert set(CODECS) == {"raw", "int8"}
    assert LayerGroup.ATTENTION.role == LayerGroup.SLIDING.role == "kv_cold"
    assert LayerGroup.SSM.role == LayerGroup.CONV.role == "ssm_cold"


def test_quality_helpers() -> None:
    a = np.array([1.0, -2.0, np.inf, np.nan])
    assert snr_db(a, a) == float("inf") and max_abs_error(a, a) == 0.0
    b = np.array([1.1, -2.0, np.inf, np.nan])
    assert snr_db(a, b) == pytest.approx(10 * np.log10(5 / 0.01))
    assert max_abs_error(a, b) == pytest.approx(0.1)
    c = np.array([1.0, -2.0, 0.0, np.nan])  # inf lost
    assert snr_db(a, c) == float("-inf") and max_abs_error(a, c) == float("inf")
    with pytest.raises(CodecError):
        snr_db(a, a[:2])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_huge_magnitudes_are_kept_raw_instead_of_overflowing(dtype: str) -> None:
    big = np.array([3.3e38, -1.0, 2.0**127, 0.5, 1.0, 2.0, 3.0, 4.0], np.float32)
    x = f32_to_bf16_bits(big) if dtype == "bfloat16" else big
    blob = encode(x, "int8", group_size=4, **kw(dtype))
    assert read_header(blob).flags & FLAG_EXCEPTIONS
    _, y = decode(blob, out_dtype=dtype)
    assert y[:4].tobytes() == x[:4].tobytes()
    assert np.isfinite(decode(blob)[1]).all()


def test_concurrent_encodes_and_decodes_do_not_share_buffers() -> None:
    from concurrent.futures import ThreadPoolExecutor

    arrays = [make((64, 128), "float16", seed=s) for s in range(16)]
    expected = [decode(encode(a, "int8"))[1] for a in arrays]

    def roundtrip(i: int) -> bool:
        return all(np.array_equal(decode(encode(arrays[i], "int8"))[1], expected[i]) for _ in range(5))

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(roundtrip, range(16)))


def test_header_integers_must_be_integers() -> None:
    x = make((4, 8), "float16")
    assert read_header(encode(x, tokens=int(np.int64(16)))).tokens == 16
    for bad in (1.5, True, "16"):
        with pytest.raises(CodecError):
            encode(x, tokens=bad)  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        encode(x, "int8", group_size=2**32)
