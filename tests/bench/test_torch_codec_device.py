"""``benchmarks/torch_codec_device.py``: every contender is timed, and a device path that computes other
bits than the CPU fails the run. Here it runs on the CPU (there is no GPU on the machines the suite runs
on); on a GPU machine the same checks run with ``--device cuda``."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from benchmarks import torch_codec_device as bench  # noqa: E402

DEVICE = torch.device("cpu")


def blocks(n: int = 2) -> list[Any]:
    return bench.make_blocks(bench.SHAPES["tiny"], torch.bfloat16, n, DEVICE)


def test_every_contender_gets_a_rate_and_each_codec_a_ratio_to_its_copy() -> None:
    got = bench.summarize(bench.interleaved(bench.contenders(blocks(), DEVICE), 2 * 8192, repeats=2))
    copies = {"d2h", "h2d", "d2h pinned", "h2d pinned"}
    codecs = {"encode raw", "decode raw", "encode int8", "decode int8"}
    assert set(got["gbps"]) == copies | codecs and all(v > 0 for v in got["gbps"].values())
    assert set(got["vs_copy"]) == codecs and all(v > 0 for v in got["vs_copy"].values())


def test_a_device_encoder_that_makes_other_bytes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real = bench.encode_tensor

    def first_call_differs(t: Any, codec: str) -> bytes:
        calls["n"] += 1
        blob = real(t, codec)
        return blob[:-1] + bytes([blob[-1] ^ 1]) if calls["n"] == 1 else blob

    monkeypatch.setattr(bench, "encode_tensor", first_call_differs)
    with pytest.raises(AssertionError, match="encodes to other bytes"):
        bench.check_bits(blocks(1), "int8")


def test_a_device_decoder_that_writes_other_bits_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = bench.decode_tensor

    def skewed_on_device(blob: bytes, **kwargs: Any) -> Any:
        header, t = real(blob, **kwargs)
        return header, (t + 1 if "device" in kwargs else t)

    monkeypatch.setattr(bench, "decode_tensor", skewed_on_device)
    with pytest.raises(AssertionError, match="decodes to other bits"):
        bench.check_bits(blocks(1), "raw")
