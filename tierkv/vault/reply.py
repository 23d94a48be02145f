"""A BatchGet reply as frames, read from LMDB in short transactions.

Frames point into LMDB's map (no copy) for as long as the reader's transaction is open (:attr:`pinned`).
The sender may wait on the network with the frame still pinned only while the transaction is young and no
map resize waits for it (:attr:`stale` is False); otherwise it copies what it has not sent yet and calls
:meth:`BatchGetReply.release`: the transaction ends, the blob in progress is copied out, and the next key
opens a fresh transaction. A reply also releases by itself between frames once its transaction is stale,
so no peer, however slow, keeps a read transaction open longer than
:data:`~tierkv.vault.store.READ_TXN_MAX_S`, pins pages for longer or stalls writers.

Packing follows :func:`tierkv.wire.framing.encode_frame_parts`: a blob that fits an empty frame never
straddles two, larger blobs span frames.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tierkv.vault.store import Lookup, Reader, key_prefix
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
        self.frame_len = 0
        """Bytes of the frame :meth:`frames` yielded last, its head and body (a sender's record length)."""

    def frames(self) -> Iterator[list[Buffer]]:
        """Each frame as a gather list; valid until the next one is asked for or :meth:`release`."""
        header, used = pb.FrameHeader(), 0
        parts: list[Buffer] = []
        limit = self._frame_bytes
        prefix, read = key_prefix(self._namespace), self._reader.read
        for index, key in enumerate(self._keys):
            status, view = read(prefix + key)
            self._data = _EMPTY if view is None else view
            size, offset = len(self._data), 0
            if used and used + size > limit and size <= limit:
                yield self._frame(header, parts, used)
                header, parts, used = pb.FrameHeader(), [], 0
                self._check()
            while True:
                if len(header.segments) >= MAX_SEGMENTS_PER_FRAME or (used >= limit and offset < size):
                    yield self._frame(header, parts, used)
                    header, parts, used = pb.FrameHeader(), [], 0
                    self._check()
                take = min(size - offset, limit - used)
                header.segments.add(key=key, index=index, status=_STATUS[status], size=size, length=take)
                if take:
                    parts.append(
                        self._data if take == size else memoryview(self._data)[offset : offset + take]
                    )
                used += take
                offset += take
                if offset >= size:
                    break
        if header.segments:
            yield self._frame(header, parts, used)

    def _frame(self, header: pb.FrameHeader, parts: list[Buffer], body_len: int) -> list[Buffer]:
        frame = frame_parts(header, parts, body_len)
        self.sent_bytes += body_len
        self.frame_len = len(frame[0]) + body_len
        return frame

    @property
    def pinned(self) -> bool:
        """The frames handed out since the last release point into LMDB's map."""
        return self._reader.pinned

    @property
    def stale(self) -> bool:
        """The read transaction is old or a map resize waits for it: release before waiting on anything."""
        return self._reader.stale

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
