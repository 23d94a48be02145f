"""How the pipeline turns an engine's arrays into blobs and back, without knowing the engine.

A hook picks an :class:`Arrays` implementation for its tensor type: :class:`NumpyArrays` here (also the
route for MLX arrays, through numpy), :class:`tierkv.tiering.tensors.TorchArrays` for torch (kept in its
own module so this package never imports torch). ``decode_into`` verifies the blob against an
:class:`~tierkv.tiering.spec.Expect` and writes the values into caller-provided memory. Implementations
that can also hand out a ``raw`` blob's values without copying them (:class:`ViewingArrays`: ``view``
verifies the same way) serve hooks that write blocks straight into their cache; those that decode many
blobs into the rows of one array at once (:class:`RowArrays`) serve hooks that decode into a buffer, and
those that decode many blobs each into a slot of its own (:class:`SlotArrays`) serve restores decoded
while they arrive. All raise
:class:`~tierkv.errors.TierKVError` for anything that does not verify.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from tierkv.codec import Buffer, LayerGroup, decode, encode
from tierkv.errors import TierKVError
from tierkv.tiering.spec import Expect

A = TypeVar("A")
A_contra = TypeVar("A_contra", contravariant=True)


class Arrays(Protocol[A_contra]):
    """Encode one block array into a blob; verify and decode one blob into an array slot."""

    def encode(self, block: A_contra, codec: str, tokens: int, layer_group: LayerGroup) -> bytes: ...

    def decode_into(self, blob: Buffer, out: A_contra, expect: Expect) -> None: ...


@runtime_checkable
class ViewingArrays(Arrays[A], Protocol[A]):
    """:class:`Arrays` that also verify a ``raw`` blob and return its values over the blob's memory."""

    def view(self, blob: Buffer, expect: Expect) -> A: ...


@runtime_checkable
class RowArrays(Arrays[A_contra], Protocol[A_contra]):
    """:class:`Arrays` that verify a restore's blobs all at once and decode the n-th good one into row n
    of one array: cheaper than blob by blob where a codec pays a fixed cost per call (torch's int8)."""

    def decode_rows(
        self, blobs: Sequence[Buffer], into: A_contra, expect: Expect
    ) -> list[TierKVError | None]: ...


@runtime_checkable
class SlotArrays(Arrays[A_contra], Protocol[A_contra]):
    """:class:`Arrays` that verify many blobs at once and decode blob k into ``slots[k]``, wherever the
    slots lie: what a run of a restore decoded while it arrives needs (key i into its own slot), at the
    cost per run rather than per blob that :class:`RowArrays` has."""

    def decode_slots(
        self, blobs: Sequence[Buffer], slots: Sequence[A_contra], expect: Expect
    ) -> list[TierKVError | None]: ...


@runtime_checkable
class RowWindows(RowArrays[A], Protocol[A]):
    """:class:`RowArrays` that can also address rows from ``first`` on and move one row, which is what
    decoding a restore while it arrives needs (:meth:`ColdTier.restore` with ``decode_behind``)."""

    def rows_from(self, into: A, first: int) -> A: ...

    def move_row(self, into: A, src: int, dst: int) -> None: ...

    def worker_init(self) -> Callable[[], None]:
        """Called on the caller's thread: what a decode worker runs first to decode as the caller would
        (torch keeps its thread count per thread)."""
        ...


class NumpyArrays:
    """:class:`ViewingArrays` for numpy arrays.

    numpy has no bfloat16: such a model's arrays are ``uint16`` bits, declared with ``dtype="bfloat16"``.
    """

    def __init__(self, dtype: str | None = None) -> None:
        self.dtype = dtype

    def encode(self, block: npt.NDArray[Any], codec: str, tokens: int, layer_group: LayerGroup) -> bytes:
        array = np.ascontiguousarray(block)
        return encode(array, codec=codec, tokens=tokens, layer_group=layer_group, dtype=self.dtype)

    def decode_into(self, blob: Buffer, out: npt.NDArray[Any], expect: Expect) -> None:
        decode(
            blob,
            out=out,
            out_dtype=self.dtype if self.dtype is not None else str(out.dtype),
            expect=expect,
        )

    def view(self, blob: Buffer, expect: Expect) -> npt.NDArray[Any]:
        """The values of a verified ``raw`` blob, over the blob's memory (read only, no copy)."""
        _, values = decode(
            blob,
            copy=False,
            out_dtype=self.dtype,
            expect=expect.but(codec="raw"),
        )
        return values


__all__ = ["A", "Arrays", "NumpyArrays", "RowArrays", "RowWindows", "SlotArrays", "ViewingArrays"]
