"""Receiving a blob straight into the memory it is meant for.

A restore's blobs end in an engine's cache; receiving each into a buffer first and copying it there
afterwards moves every byte once more than needed (4–5 ms for 33 MB on a 2-core machine). A get's sink
that knows where a blob's bytes belong offers a :class:`Landing` for it before any of its bytes are
read: the blob's bytes in order, spread over writable buffers (a small one for the blob's header, then
the cache's own rows). The bulk transport receives the blob into them with ``recvmsg_into`` and then
says :meth:`Landing.landed`; the sink verifies the bytes where they lie.

Who lands must accept that the memory holds unverified bytes until ``landed`` decides, and garbage
after :meth:`Landing.abandon` (the reply broke off mid-blob): a cache block that is being restored is
exactly such memory, as it is not used until the restore says it is good.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from tierkv.codec.header import Buffer


class Landing(Protocol):
    """Where one blob's bytes go, and what happens once they are there."""

    @property
    def buffers(self) -> Sequence[memoryview]:
        """Writable byte views that together hold exactly the blob's bytes, in order."""

    def landed(self) -> None:
        """Every byte is in; verify and keep the verdict (never raises)."""

    def abandon(self) -> None:
        """The reply broke off before every byte was in; the buffers hold partial bytes, no blob."""


@runtime_checkable
class LandingSink(Protocol):
    """A get's ``on_blob(i, blob)`` that can also offer a :class:`Landing` for key ``i``'s blob of
    ``size`` bytes (None: hand it over as a buffer, as any sink)."""

    def __call__(self, i: int, blob: Buffer) -> None: ...

    def land(self, i: int, size: int) -> Landing | None: ...


class Renumbered:
    """A sink for a get of some of a caller's keys: position ``j`` there is ``positions[j]`` here; it
    lands where the caller's sink lands."""

    def __init__(self, sink: Callable[[int, Buffer], None], positions: Sequence[int]) -> None:
        self.sink, self.positions = sink, positions

    def __call__(self, j: int, blob: Buffer) -> None:
        self.sink(self.positions[j], blob)

    def land(self, j: int, size: int) -> Landing | None:
        return self.sink.land(self.positions[j], size) if isinstance(self.sink, LandingSink) else None


__all__ = ["Landing", "LandingSink", "Renumbered"]
