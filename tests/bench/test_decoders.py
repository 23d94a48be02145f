"""The synthetic bench's decoders: torch's rows and numpy's blob by blob give the same values and verdicts."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tierkv.bench import decoders
from tierkv.bench.decoders import NumpyDecoder, TorchDecoder, make_decoder
from tierkv.codec import LayerGroup, encode
from tierkv.errors import BenchError

torch = pytest.importorskip("torch")

SHAPE = (4, 2, 2, 16, 64)
TOKENS = 16


def blocks(n: int, dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    out = []
    for _ in range(n):
        values = rng.standard_normal(SHAPE, dtype=np.float32)
        out.append(
            (values.view(np.uint32) >> 16).astype(np.uint16) if dtype == "bfloat16" else values.astype(dtype)
        )
    return out


def blobs_of(arrays: list[np.ndarray], codec: str, dtype: str) -> list[bytearray | None]:
    return [
        bytearray(encode(a, codec=codec, tokens=TOKENS, dtype=dtype, layer_group=LayerGroup.ATTENTION))
        for a in arrays
    ]


def as_bits(values: object) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.view(torch.int16 if values.element_size() == 2 else torch.int32).numpy()
    array = np.asarray(values)
    return array.view(np.uint16 if array.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("codec", ["raw", "int8"])
def test_both_decoders_give_the_same_bits_and_skip_what_is_missing_or_corrupt(codec: str, dtype: str) -> None:
    blobs = blobs_of(blocks(6, dtype), codec, dtype)
    blobs[1] = None  # not found in the vaults
    corrupt = blobs[3]
    assert corrupt is not None
    corrupt[-1] ^= 0xFF  # a flipped payload byte: the checksum no longer matches
    numpy_values, numpy_errors = NumpyDecoder(SHAPE, dtype, TOKENS).decode(blobs, codec)
    torch_values, torch_errors = TorchDecoder(SHAPE, dtype, TOKENS, rows=6).decode(blobs, codec)
    assert [v is None for v in numpy_values] == [v is None for v in torch_values]
    assert [v is None for v in numpy_values] == [False, True, False, True, False, False]
    assert len(numpy_errors) == len(torch_errors) == 1
    for a, b in zip(numpy_values, torch_values, strict=True):
        if a is not None:
            assert np.array_equal(as_bits(a), as_bits(b))


def test_a_blob_of_another_shape_is_rejected_by_both() -> None:
    other = blobs_of([np.zeros((2, 2, 2, 16, 64), np.float32)], "int8", "float32")
    for decoder in (NumpyDecoder(SHAPE, "float32", TOKENS), TorchDecoder(SHAPE, "float32", TOKENS, rows=1)):
        values, errors = decoder.decode(other, "int8")
        assert values == [None] and len(errors) == 1 and "shape" in errors[0]


def test_auto_takes_torch_where_it_is_installed_and_numpy_where_it_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert make_decoder("auto", SHAPE, "float32", TOKENS, 4).name == "torch"
    assert make_decoder("numpy", SHAPE, "float32", TOKENS, 4).name == "numpy"
    real = importlib.util.find_spec
    monkeypatch.setattr(
        decoders.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    assert make_decoder("auto", SHAPE, "float32", TOKENS, 4).name == "numpy"
    with pytest.raises(BenchError, match="torch is not installed"):
        make_decoder("torch", SHAPE, "float32", TOKENS, 4)
    with pytest.raises(BenchError, match="expected one of auto, numpy, torch"):
        make_decoder("cuda", SHAPE, "float32", TOKENS, 4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_ring_decode_puts_key_i_in_row_i_mod_rows_even_when_a_run_wraps(dtype: str) -> None:
    arrays = blocks(7, dtype)
    blobs = blobs_of(arrays, "int8", dtype)
    torch_dec = TorchDecoder(SHAPE, dtype, TOKENS, rows=4)
    numpy_dec = NumpyDecoder(SHAPE, dtype, TOKENS)
    # keys 2..6 of a restore in one run: rows 2, 3, then 0, 1, 2 again (key 6 overwrites key 2's row)
    assert torch_dec.decode_ring([(i, blobs[i]) for i in range(2, 6)], "int8") == []
    for i in range(2, 6):
        assert np.array_equal(as_bits(torch_dec.rows[i % 4]), as_bits(numpy_dec.one(blobs[i], "int8")))
    bad = bytearray(blobs[6])
    bad[-1] ^= 0xFF
    errors = torch_dec.decode_ring([(6, bad)], "int8")
    assert len(errors) == 1 and "checksum" in errors[0]
    assert numpy_dec.decode_ring([(6, bad), (5, blobs[5])], "int8") == errors


def test_a_raw_blob_in_the_models_dtype_is_verified_and_viewed_not_copied() -> None:
    (array,) = blocks(1, "bfloat16")
    (blob,) = blobs_of([array], "raw", "bfloat16")
    assert blob is not None
    (values,), errors = NumpyDecoder(SHAPE, "bfloat16", TOKENS).decode([blob], "raw")
    assert errors == [] and np.array_equal(values, array)
    assert np.shares_memory(values, np.frombuffer(blob, np.uint8)), "the restore copied a raw blob"
    blob[-1] ^= 1  # and it was verified: a flipped payload bit is rejected
    assert NumpyDecoder(SHAPE, "bfloat16", TOKENS).decode([blob], "raw")[0] == [None]
