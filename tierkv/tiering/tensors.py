""":class:`~tierkv.tiering.arrays.Arrays` for torch tensors (int8 quantized on the tensor's own device)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tierkv.codec import Buffer, LayerGroup
from tierkv.codec.torch_codec import decode_tensor, encode_tensor, view_tensor
from tierkv.codec.torch_rows import decode_rows, decode_slots
from tierkv.errors import TierKVError
from tierkv.tiering.spec import Expect


class TorchArrays:
    """Encode blocks with :func:`encode_tensor`; decode into ``out`` (any device, strided) with one copy,
    many blobs into the rows of one tensor or into slots of their own at once, or view a raw blob
    without copying."""

    def encode(self, block: torch.Tensor, codec: str, tokens: int, layer_group: LayerGroup) -> bytes:
        return encode_tensor(block, codec=codec, tokens=tokens, layer_group=layer_group)

    def decode_into(self, blob: Buffer, out: torch.Tensor, expect: Expect) -> None:
        decode_tensor(blob, dtype=out.dtype, out=out, expect=expect)

    def decode_rows(
        self, blobs: Sequence[Buffer], into: torch.Tensor, expect: Expect
    ) -> list[TierKVError | None]:
        """Verify every blob, then decode the n-th good one into ``into[n]`` (int8 runs on CPU at once)."""
        return decode_rows(blobs, into, expect)

    def decode_slots(
        self, blobs: Sequence[Buffer], slots: Sequence[torch.Tensor], expect: Expect
    ) -> list[TierKVError | None]:
        """Verify every blob, then decode blob k into ``slots[k]`` (int8 runs bound for CPU at once)."""
        return decode_slots(blobs, slots, expect)

    def rows_from(self, into: torch.Tensor, first: int) -> torch.Tensor:
        return into.narrow(0, first, into.shape[0] - first)

    def move_row(self, into: torch.Tensor, src: int, dst: int) -> None:
        into[dst].copy_(into[src])

    def worker_init(self) -> Callable[[], None]:
        """A decode worker uses the caller's torch thread count (a new thread would otherwise use one)."""
        threads = torch.get_num_threads()
        return lambda: torch.set_num_threads(threads)

    def view(self, blob: Buffer, expect: Expect) -> torch.Tensor:
        """The values of a verified ``raw`` blob as a CPU tensor over the blob's memory (read only)."""
        return view_tensor(blob, expect=expect)


__all__ = ["TorchArrays"]
