"""How ``tierkv bench synthetic`` verifies and decodes a restore's batch: the way the engine hooks do.

A raw blob is verified and viewed, never copied: the hooks receive or place raw blocks straight into their
cache. An int8 blob has to be dequantized into the model's dtype, and there the decoder matters: the vLLM
and transformers hooks decode with torch (every blob of a restore verified first, then each run of blobs
dequantized in one pass, :func:`tierkv.codec.torch_rows.decode_rows`), which on one core runs about twice
as fast as numpy blob by blob. ``auto`` takes torch where it is installed (the ``hf`` extra) and numpy
otherwise (a vault machine), so the figure is what an engine on this machine would see.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from tierkv.codec import Buffer, Expect, decode
from tierkv.errors import BenchError, TierKVError

DECODERS = ("auto", "numpy", "torch")

Decoded = tuple[list[Any | None], list[str]]
"""Per blob its values (None: missing or rejected), and why each rejected blob was rejected."""


class NumpyDecoder:
    """Blob by blob with the numpy codec, into a fresh array each (a raw blob in the model's dtype: a
    read-only view of its bytes, valid as long as the blob is)."""

    name = "numpy"

    def __init__(self, shape: tuple[int, ...], dtype: str, tokens: int) -> None:
        self.shape, self.dtype, self.tokens = shape, dtype, tokens

    def one(self, blob: Buffer, codec: str) -> Any:
        """One blob's values; raises :class:`~tierkv.errors.TierKVError` when it does not verify."""
        expect = Expect(None, codec, self.shape, self.tokens)
        _, array = decode(blob, out_dtype=self.dtype, expect=expect, copy=False)
        return array

    def decode(self, blobs: Sequence[Buffer | None], codec: str) -> Decoded:
        values: list[Any | None] = []
        errors: list[str] = []
        for blob in blobs:
            try:
                values.append(None if blob is None else self.one(blob, codec))
            except TierKVError as exc:
                errors.append(str(exc))
                values.append(None)
        return values, errors

    def decode_ring(self, run: Sequence[tuple[int, Buffer]], codec: str) -> list[str]:
        """Decode blobs as :class:`~tierkv.tiering.behind.DecodeBehind` hands them over (each into a fresh
        array); why each rejected blob was rejected."""
        return self.decode([blob for _, blob in run], codec)[1]


class TorchDecoder:
    """int8 batches into the rows of one reused torch tensor (``decode_rows``); raw blobs as numpy.

    The values it returns are rows of that tensor: valid until the next :meth:`decode`."""

    name = "torch"

    def __init__(self, shape: tuple[int, ...], dtype: str, tokens: int, rows: int, threads: int = 0) -> None:
        import torch

        self.raw = NumpyDecoder(shape, dtype, tokens)
        self.rows = torch.empty((rows, *shape), dtype=getattr(torch, dtype))
        self.threads = threads or torch.get_num_threads()
        """Threads each decode uses, whichever thread calls it: torch keeps the count per calling thread
        (a thread started later decodes on one unless told), so both restore paths are told the same."""

    def _own_threads(self) -> None:
        import torch

        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def decode(self, blobs: Sequence[Buffer | None], codec: str) -> Decoded:
        if codec == "raw":
            return self.raw.decode(blobs, codec)
        from tierkv.codec.torch_rows import decode_rows

        self._own_threads()
        present = [i for i, blob in enumerate(blobs) if blob is not None]
        verdicts = decode_rows(
            [blob for blob in blobs if blob is not None],
            self.rows,
            Expect(None, codec, self.raw.shape, self.raw.tokens),
        )
        values: list[Any | None] = [None] * len(blobs)
        good = [i for i, verdict in zip(present, verdicts, strict=True) if verdict is None]
        for row, i in enumerate(good):  # decode_rows puts the n-th good blob into row n
            values[i] = self.rows[row]
        return values, [str(verdict) for verdict in verdicts if verdict is not None]

    def decode_ring(self, run: Sequence[tuple[int, Buffer]], codec: str) -> list[str]:
        """Decode blobs as :class:`~tierkv.tiering.behind.DecodeBehind` hands them over: key ``i`` into
        row ``i % rows`` (a run that wraps around is decoded in two parts); why each rejected blob was
        rejected. The caller keeps at most ``rows`` blobs in flight, so no row is overwritten early."""
        if codec == "raw":
            return self.raw.decode_ring(run, codec)
        from tierkv.codec.torch_rows import decode_rows

        self._own_threads()
        size = self.rows.shape[0]
        errors: list[str] = []
        start = 0
        while start < len(run):
            first = run[start][0] % size
            stop = start + 1
            while stop < len(run) and run[stop][0] % size == first + stop - start:
                stop += 1
            verdicts = decode_rows(
                [blob for _, blob in run[start:stop]],
                self.rows.narrow(0, first, stop - start),
                Expect(None, codec, self.raw.shape, self.raw.tokens),
            )
            errors += [str(verdict) for verdict in verdicts if verdict is not None]
            start = stop
        return errors


def make_decoder(
    choice: str, shape: tuple[int, ...], dtype: str, tokens: int, rows: int, threads: int = 0
) -> NumpyDecoder | TorchDecoder:
    """The decoder ``choice`` names (``auto``: torch where it is installed); rows = blocks per batch;
    ``threads`` per torch decode (0: torch's default in this process)."""
    if choice not in DECODERS:
        raise BenchError(f"--decoder: expected one of {', '.join(DECODERS)}, got {choice!r}")
    have_torch = importlib.util.find_spec("torch") is not None
    if choice == "torch" and not have_torch:
        raise BenchError("--decoder torch: torch is not installed here (pip install 'tierkv[hf]')")
    if choice == "numpy" or not have_torch:
        return NumpyDecoder(shape, dtype, tokens)
    return TorchDecoder(shape, dtype, tokens, rows, threads)


__all__ = ["DECODERS", "Decoded", "NumpyDecoder", "TorchDecoder", "make_decoder"]
