"""``uint8`` blobs: opaque bytes (packed formats such as quantized KV caches), raw only, never converted."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.codec import decode, encode, read_header
from tierkv.codec.expect import Expect
from tierkv.errors import CodecError, CorruptBlobError


@settings(max_examples=50, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), seed=st.integers(0, 2**32 - 1))
def test_bytes_round_trip_exactly(shape: list[int], seed: int) -> None:
    values = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    blob = encode(values, tokens=7)
    header, out = decode(blob, expect=Expect(dtype="uint8", tokens=7))
    assert header.dtype == "uint8" and header.codec == "raw" and out.dtype == np.uint8
    assert np.array_equal(out, values)
    into = np.empty_like(values)
    decode(blob, out=into)
    assert np.array_equal(into, values)


def test_bytes_are_never_quantized_or_converted() -> None:
    values = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    with pytest.raises(CodecError, match="int8 codec quantizes floats"):
        encode(values, "int8")
    blob = encode(values)
    for target in ("float32", "bfloat16"):
        with pytest.raises(CodecError, match="cannot be decoded as"):
            decode(blob, out_dtype=target)
    floats = encode(np.ones((2, 3), np.float32))
    with pytest.raises(CodecError, match="cannot be decoded as uint8"):
        decode(floats, out_dtype="uint8")


def test_an_int8_header_claiming_bytes_is_refused() -> None:
    blob = encode(np.ones((4, 8), np.float32), "int8")
    header = read_header(blob)
    forged = dataclasses.replace(header, dtype="uint8").pack() + blob[header.header_len :]
    with pytest.raises(CorruptBlobError, match="int8 payload cannot hold uint8"):
        decode(forged)


def test_bytes_do_not_decode_to_torch_tensors() -> None:
    torch_codec = pytest.importorskip("tierkv.codec.torch_codec")
    with pytest.raises(CodecError, match="float dtypes only"):
        torch_codec.decode_tensor(encode(np.zeros((2, 2), np.uint8)))
