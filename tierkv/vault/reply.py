"""A BatchGet reply as frames, read from LMDB in short transactions.

Frames point into LMDB's map (no copy) for as long as the reader's transaction is open. The sender
calls :meth:`BatchGetReply.release` whenever it is about to wait on the network (after copying what it
has not sent yet): the transaction ends, the blob in progress is copied out, and the next key opens a
fresh transaction. A reply also releases by itself between frames once its transaction is old or a map
resize waits, so no peer, however slow, keeps a read transaction open, pins pages or stalls writers.

Packing follows :func:`tierkv.wire.framing.encode_frame_parts`: a blob that fits an empty frame never
straddles two, larger blobs span frames.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tierkv.vault.store import Lookup, Reader
from tierkv.wire import pb
from tierkv.wire.framing import CORRUPT, FOUND, MAX_SEGMENTS_PER_FRAME, MISSING, Buffer, frame_parts

_STATUS = {Lookup.FOUND: FOUND, Lookup.MISSING: MISSING, Lookup.CORRUPT: CORRUPT}
_EMPTY = memoryview(b"")


class BatchGetReply:
    """The reply frames for ``keys``; iterate :meth:`frames` once, then :meth:`close`."""

    def __init__(self, reader: Reader, namespace: bytes, keys: Sequence[bytes], *, frame_bytes: int) -> None:
        self._reader = reader
        self._namespace = namespace
        self._keys = keys
        self._frame_bytes = frame_bytes
        self._data: Buffer = _EMPTY
        self.sent_bytes = 0

    def frames(self) -> Iterator[list[Buffer]]:
        """Each frame as a gather list; valid until the next one is asked for or :meth:`release`."""
        header, used = pb.FrameHeader(), 0
        parts: list[Buffer] = []
        limit = self._frame_bytes
        for index, key in enumerate(self._keys):
            status, view = self._reader.get(self._namespace, key)
            self._data = _EMPTY if view is None else view
            size, offset = len(self._data), 0
            if used and used + size > limit and size <= limit:
                yield self._frame(header, parts)
                header, parts, used = pb.FrameHeader(), [], 0
                self._check()
            while True:
                if len(header.segments) >= MAX_SEGMENTS_PER_FRAME or (used >= limit and offset < size):
                    yield self._frame(header, parts)
                    header, parts, used = pb.FrameHeader(), [], 0
                    self._check()
                take = min(size - offset, limit - used)
                header.segments.add(key=key, index=index, status=_STATUS[status], size=size, length=take)
                if take:
                    parts.append(memoryview(self._data)[offset : offset + take])
                used += take
                offset += take
                if offset >= size:
                    break
        if header.segments:
            yield self._frame(header, parts)

    def _frame(self, header: pb.FrameHeader, parts: list[Buffer]) -> list[Buffer]:
        frame = frame_parts(header, parts)
        self.sent_bytes += sum(len(p) for p in parts)
        return frame

    def release(self) -> None:
        """End the read transaction; the blob in progress continues from a copy."""
        if isinstance(self._data, memoryview) and len(self._data):
            self._data = bytes(self._data)
        self._reader.release()

    def _check(self) -> None:
        """Between frames: release if the transaction has lived long enough or a resize waits."""
        if self._reader.stale:
            self.release()

    def close(self) -> None:
        self._data = _EMPTY
        self._reader.close()
