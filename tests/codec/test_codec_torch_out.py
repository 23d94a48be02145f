"""Raw blobs decode straight into a strided slice of a bigger tensor (how restores skip a concatenation)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tierkv.codec.expect import Expect  # noqa: E402
from tierkv.codec.torch_codec import decode_tensor, encode_tensor, view_tensor  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_raw_decode_into_a_token_slice(dtype: torch.dtype) -> None:
    blocks = [torch.randn(3, 2, 2, 4, 8).to(dtype) for _ in range(3)]
    whole = torch.full((3, 2, 2, 12, 8), float("nan"), dtype=dtype)
    for i, block in enumerate(blocks):
        blob = encode_tensor(block, codec="raw", tokens=4)
        out = whole[:, :, :, i * 4 : (i + 1) * 4]
        assert not out.is_contiguous()
        _, got = decode_tensor(blob, out=out)
        assert got.data_ptr() == out.data_ptr()
    assert torch.equal(whole, torch.cat(blocks, dim=3))


def test_decode_into_out_of_another_dtype_still_converts() -> None:
    block = torch.randn(2, 3, 4)
    out = torch.empty(2, 3, 4, dtype=torch.float16)
    decode_tensor(encode_tensor(block, codec="raw"), dtype=torch.float16, out=out)
    assert torch.equal(out, block.to(torch.float16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_view_tensor_is_the_blob_itself_verified(dtype: torch.dtype) -> None:
    """A restore that places blocks copies each one once: the view shares the received bytes."""
    import numpy as np

    from tierkv.codec import LayerGroup
    from tierkv.errors import CodecError, CorruptBlobError

    block = torch.randn(2, 3, 4).to(dtype)
    blob = bytearray(encode_tensor(block, codec="raw", tokens=4, layer_group=LayerGroup.ATTENTION))
    values = view_tensor(blob, expect=Expect(shape=(2, 3, 4), dtype=dtype, tokens=4))
    start = np.frombuffer(blob, np.uint8).ctypes.data
    assert values.dtype == dtype and start < values.data_ptr() < start + len(blob), "no copy"
    assert torch.equal(values, block)
    with pytest.raises(CodecError, match="tokens"):
        view_tensor(blob, expect=Expect(tokens=8))
    with pytest.raises(CodecError, match="codec"):
        view_tensor(encode_tensor(block.float(), codec="int8"))
    blob[-1] ^= 1
    with pytest.raises(CorruptBlobError):
        view_tensor(blob)
