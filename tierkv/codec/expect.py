"""What a caller expects a blob's header to say, in one value: every decode and verify takes one.

A restore knows what it asked for — layer group, codec, shape, tokens per block, and often the dtype —
and a blob that says otherwise is not the block it wants, however well its checksums hold. A field left
None is not checked.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tierkv.codec.header import BlobHeader, LayerGroup, dtype_info
from tierkv.errors import CodecError


@dataclasses.dataclass(frozen=True)
class Expect:
    """The header a blob must carry; None fields are not checked."""

    layer_group: LayerGroup | None = None
    codec: str | None = None
    shape: tuple[int, ...] | None = None
    tokens: int | None = None
    dtype: str | None = None

    def __post_init__(self) -> None:
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype is not None:
            object.__setattr__(self, "dtype", dtype_info(_dtype_name(self.dtype)).name)

    def but(self, **changes: object) -> Expect:
        """A copy with some fields replaced (``expect.but(codec="raw")``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def check(self, header: BlobHeader) -> None:
        """Raise :class:`CodecError` naming every field where ``header`` disagrees."""
        problems = []
        if self.shape is not None and self.shape != header.shape:
            problems.append(f"shape {header.shape} != expected {self.shape}")
        if self.dtype is not None and self.dtype != header.dtype:
            problems.append(f"dtype {header.dtype} != expected {self.dtype}")
        if self.codec is not None and self.codec != header.codec:
            problems.append(f"codec {header.codec} != expected {self.codec}")
        if self.tokens is not None and self.tokens != header.tokens:
            problems.append(f"tokens {header.tokens} != expected {self.tokens}")
        if self.layer_group is not None and LayerGroup(self.layer_group) is not header.layer_group:
            problems.append(
                f"layer group {header.layer_group.name} != expected {LayerGroup(self.layer_group).name}"
            )
        if problems:
            raise CodecError("blob does not match expectations: " + "; ".join(problems))


def _dtype_name(dtype: object) -> str:
    """A dtype's name from a string, a numpy dtype or type, or a torch dtype (without importing torch)."""
    if isinstance(dtype, str):
        return dtype
    if type(dtype).__module__ == "torch":
        return str(dtype).removeprefix("torch.")
    return str(np.dtype(dtype).name)  # type: ignore[call-overload]


NOTHING = Expect()
"""Expect nothing: only the checksums and the header's own invariants are checked."""

__all__ = ["NOTHING", "Expect"]
