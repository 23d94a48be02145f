"""``benchmarks/int8_rows_bench.py``: both contenders write the same bits and both are timed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from benchmarks import int8_rows_bench  # noqa: E402


def test_the_contenders_agree_and_each_gets_a_median() -> None:
    got = int8_rows_bench.measure(torch.bfloat16, blocks=3, rounds=2)
    assert set(got["ms"]) == {"blob_by_blob", "rows"} and all(v > 0 for v in got["ms"].values())
    assert got["speedup"] > 0


def test_a_decoder_that_writes_other_bits_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = int8_rows_bench.contenders

    def skewed(blobs: list[bytes], into: torch.Tensor) -> dict[str, object]:
        runs = real(blobs, into)
        rows = runs["rows"]
        runs["rows"] = lambda: (rows(), into.add_(1))
        return runs

    monkeypatch.setattr(int8_rows_bench, "contenders", skewed)
    with pytest.raises(AssertionError, match="bits differ"):
        int8_rows_bench.measure(torch.float32, blocks=2, rounds=1)
