"""The torch twin: byte-identical blobs to the numpy codec, and decoding into tensors.

The tests marked with a ``device`` run once on the CPU and once on CUDA; the CUDA runs are skipped on a
machine without a CUDA device (the suite's usual machines), and run as they are on one that has it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

try:
    import torch
except ImportError:
    pytest.skip("torch is not installed: the torch codec twin cannot be tested", allow_module_level=True)

from tierkv.codec import FLAG_EXCEPTIONS, LayerGroup, decode, encode, read_header
from tierkv.codec.expect import Expect
from tierkv.codec.torch_codec import decode_tensor, encode_tensor, numpy_view
from tierkv.errors import CodecError

TORCH_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


def tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def numpy_encode(t: torch.Tensor, codec: str, **kwargs: Any) -> bytes:
    dtype = "bfloat16" if t.dtype == torch.bfloat16 else None
    return encode(numpy_view(t.contiguous()), codec, dtype=dtype, **kwargs)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=lambda d: NAMES[d])
@pytest.mark.parametrize("codec", ["raw", "int8"])
@pytest.mark.parametrize(
    ("shape", "group"),
    [
        ((4, 2, 2, 16, 64), None),
        ((1000,), 128),
        ((129,), 128),
        ((1,), 128),
        ((3, 7, 11), 5),
        ((0,), 16),
        ((), None),
        ((2, 9000), 3000),
    ],
)
@pytest.mark.parametrize("device", DEVICES)
def test_torch_and_numpy_blobs_are_identical(
    dtype: torch.dtype, codec: str, shape: tuple[int, ...], group: int | None, device: str
) -> None:
    t = tensor(shape, dtype, seed=len(shape))
    kwargs: dict[str, Any] = {"group_size": group, "tokens": 16, "layer_group": LayerGroup.CONV}
    blob = encode_tensor(t.to(device), codec, **kwargs)
    assert blob == numpy_encode(t, codec, **kwargs)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=lambda d: NAMES[d])
@pytest.mark.parametrize("device", DEVICES)
def test_identical_on_awkward_values(dtype: torch.dtype, device: str) -> None:
    t = tensor((40, 37), dtype, seed=3)
    t[0] = 0  # all-zero group
    t[1, 3] = float("inf")
    t[5, 0] = float("-inf")
    t[9, 36] = float("nan")
    t[39, 36] = float("nan")  # in the short tail group
    t[20] = t[20] * 1e-30 if dtype != torch.float16 else t[20] * 1e-4  # subnormal-scale territory
    t[21, :4] = torch.tensor([0.5, -0.5, 1.5, 2.5]).to(dtype)  # ties to even after scaling
    if dtype != torch.float16:
        t[30, 0] = 2.0**127  # kept raw, q * scale could overflow
    for group in (1, 8, 37, 100):
        blob = encode_tensor(t.to(device), "int8", group_size=group)
        assert blob == numpy_encode(t, "int8", group_size=group), f"group {group}"
        assert read_header(blob).flags & FLAG_EXCEPTIONS


def test_noncontiguous_and_grad_tensors_encode_like_their_copies() -> None:
    base = tensor((8, 64), torch.float16)
    view = base[:, ::2]
    assert encode_tensor(view, "int8") == encode_tensor(view.contiguous(), "int8")
    with_grad = base.float().requires_grad_(True)
    assert encode_tensor(with_grad, "int8") == encode_tensor(base.float(), "int8")


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=lambda d: NAMES[d])
@pytest.mark.parametrize("codec", ["raw", "int8"])
@pytest.mark.parametrize("out_dtype", [None, *TORCH_DTYPES])
@pytest.mark.parametrize("device", DEVICES)
def test_decode_tensor_matches_numpy_decode(
    dtype: torch.dtype, codec: str, out_dtype: torch.dtype | None, device: str
) -> None:
    t = tensor((6, 3, 50), dtype, seed=9)
    t[2, 1, 7] = float("nan")
    blob = encode_tensor(t, codec, group_size=32)
    header, got = decode_tensor(blob, device=device, dtype=out_dtype)
    expected_dtype = out_dtype or dtype  # default: the blob's own dtype
    assert got.dtype == expected_dtype and tuple(got.shape) == header.shape and got.device.type == device
    got = got.cpu()
    _, ref = decode(blob, out_dtype=NAMES[expected_dtype])
    assert numpy_view(got).tobytes() == ref.tobytes()
    if codec == "raw" and out_dtype in (None, dtype):
        assert numpy_view(got).tobytes() == numpy_view(t).tobytes()  # lossless, NaN bits included


@pytest.mark.parametrize("device", DEVICES)
def test_decode_tensor_into_out_and_expectations(device: str) -> None:
    t = tensor((4, 2, 16, 8), torch.bfloat16)
    blob = encode_tensor(t, "int8", tokens=16)
    fresh = decode_tensor(blob)[1].to(device)
    out = torch.full((4, 2, 16, 8), float("nan"), dtype=torch.bfloat16, device=device)
    _, got = decode_tensor(blob, out=out)
    assert got is out and torch.equal(out, fresh)
    strided = torch.zeros((4, 2, 16, 16), dtype=torch.bfloat16, device=device)[..., ::2]
    _, got = decode_tensor(blob, out=strided)
    assert got is strided and torch.equal(strided, fresh)
    raw = encode_tensor(t, "raw")
    out32 = torch.zeros((4, 2, 16, 8), device=device)
    decode_tensor(raw, dtype=torch.float32, out=out32)
    assert torch.equal(out32, t.float().to(device))
    with pytest.raises(CodecError):
        decode_tensor(blob, out=torch.zeros((4, 2, 16, 8), device=device))  # float32 out, bfloat16 result
    with pytest.raises(CodecError):
        decode_tensor(blob, expect=Expect(dtype=torch.float16))
    with pytest.raises(CodecError):
        decode_tensor(blob, expect=Expect(shape=(4, 2, 8, 16)))
    with pytest.raises(CodecError):
        decode_tensor(blob, expect=Expect(tokens=32))
    decode_tensor(blob, expect=Expect(None, "int8", (4, 2, 16, 8), None, torch.bfloat16))


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=lambda d: NAMES[d])
@pytest.mark.parametrize("device", DEVICES)
def test_raw_decodes_survive_the_received_bytes_being_reused(dtype: torch.dtype, device: str) -> None:
    """A restore reuses its receive buffer as soon as a decode returns: the values must already be taken
    (on a GPU the copy to the device is still queued then), into contiguous and strided slots alike."""
    blocks = [tensor((2, 2, 16, 8), dtype, seed=s) for s in range(6)]
    received = bytearray(len(encode_tensor(blocks[0], "raw")))
    cache = torch.full((2, 2, 16, 6 * 8), float("nan"), dtype=dtype, device=device)
    fresh = torch.empty((6, 2, 2, 16, 8), dtype=dtype, device=device)
    for n, block in enumerate(blocks):
        received[:] = encode_tensor(block, "raw")
        decode_tensor(received, out=cache[..., n * 8 : (n + 1) * 8])
        decode_tensor(received, out=fresh[n])
        received[:] = bytes(len(received))  # the next reply lands here before the device copied this one
    for n, block in enumerate(blocks):
        assert (
            numpy_view(cache[..., n * 8 : (n + 1) * 8].cpu().contiguous()).tobytes()
            == numpy_view(block).tobytes()
        )
        assert numpy_view(fresh[n].cpu()).tobytes() == numpy_view(block).tobytes()


def test_encode_tensor_rejects_unsupported_input() -> None:
    with pytest.raises(CodecError):
        encode_tensor(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(CodecError):
        encode_tensor(np.zeros(4, np.float32))  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        encode_tensor(torch.zeros(4), "int4")


def test_cross_decoding_between_twins() -> None:
    t = tensor((16, 128), torch.float16, seed=4, scale=1.0)
    blob = numpy_encode(t, "int8")
    _, a = decode_tensor(blob, dtype=torch.float32)
    _, b = decode(encode_tensor(t, "int8"))
    assert np.array_equal(a.numpy(), b)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=lambda d: NAMES[d])
def test_accelerator_code_path_gives_the_same_bits(dtype: torch.dtype) -> None:
    """The GPU variant (one pass in device memory, no data-dependent syncs) run on CPU tensors."""
    from tierkv.codec import int8 as int8_codec
    from tierkv.codec.blob import open_blob
    from tierkv.codec.header import DTYPES
    from tierkv.codec.torch_codec import _dequantize, _quantize

    t = tensor((70, 37), dtype, seed=8)
    t[3, 3] = float("nan")
    t[69, 36] = float("inf")
    flat = t.reshape(-1)
    blob = numpy_encode(t, "int8", group_size=16)
    header, payload = open_blob(blob)
    layout = int8_codec.Int8Layout(flat.numel(), 16)
    for accelerator in (False, True):
        region = np.empty(layout.groups_len, np.uint8)
        raw = _quantize(flat, DTYPES[NAMES[dtype]], layout, region, accelerator=accelerator)
        assert region.tobytes() == bytes(payload[: layout.groups_len])
        assert raw.tolist() == [(3 * 37 + 3) // 16, (70 * 37 - 1) // 16]
        for target in NAMES.values():
            got = _dequantize(header, payload, target, torch.device("cpu"), accelerator=accelerator)
            assert numpy_view(got).tobytes() == decode(blob, out_dtype=target)[1].tobytes()
