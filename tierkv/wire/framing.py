"""Bulk framing: blobs in and out of ``tierkv.v1.Frame`` messages without a protobuf copy of the payload.

A ``Frame`` is ``{1: FrameHeader, 2: body}``. Parsing the body as a protobuf ``bytes`` field costs 2–5×
on the data path (see the performance notes), so tierkv writes the two length-delimited fields itself
with ``b"".join`` (one copy of each blob) and reads them back as memoryview slices (no copy). The bytes
on the wire stay valid protobuf, so any other client can speak to a vault with the ``.proto`` alone, and
the decoder falls back to the full protobuf parser for encodings it does not recognise.

Retention metadata (:class:`~tierkv.retention.BlockMeta`) rides in the optional ``meta`` field of a blob's
first segment; an untagged blob sends none, so it costs not one byte more than before, and a vault or
client that predates the field ignores it. Every value is checked on the way in (:func:`meta_from_pb`).

This module does no I/O: it turns blobs into frame bytes and frame bytes back into blobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence

from google.protobuf.message import DecodeError

from tierkv.limits import MAX_KEY_BYTES, MAX_NAMESPACE_BYTES
from tierkv.retention.classes import BlockMeta, pack_tokens, unpack_tokens
from tierkv.wire._proto import vault_pb2 as pb

Buffer = bytes | bytearray | memoryview

FOUND = pb.FOUND
MISSING = pb.MISSING
CORRUPT = pb.CORRUPT
STORED = pb.STORED
REJECTED = pb.REJECTED

MAX_SEGMENTS_PER_FRAME = 4096
_EMPTY = memoryview(b"")


class FrameError(ValueError):
    """A frame is malformed or inconsistent (the vault answers INVALID_ARGUMENT, a client raises
    ``VaultError``). Every parse failure of this module is one: no IndexError or DecodeError escapes."""


class FrameLimitError(FrameError):
    """A blob or a call is larger than the configured limit (the vault answers RESOURCE_EXHAUSTED)."""


@dataclasses.dataclass(slots=True)
class Blob:
    """One keyed blob (or, in a BatchGet reply, one key's outcome with ``data`` None unless FOUND)."""

    key: bytes
    data: Buffer | None
    index: int = 0
    status: int = FOUND
    priority: int = 0
    meta: BlockMeta | None = None


def meta_to_pb(meta: BlockMeta) -> pb.BlockMeta:
    """The wire form of a block's metadata (durability travels as its time to live)."""
    return pb.BlockMeta(
        source=meta.source,
        importance=meta.importance,
        ttl_s=meta.ttl_s or 0.0,
        protected=meta.protected,
        parent=meta.parent,
        tokens=pack_tokens(meta.tokens) if meta.tokens else b"",
    )


def meta_from_pb(m: pb.BlockMeta) -> BlockMeta:
    """Checked metadata from the wire; any value out of range is a :class:`FrameError`."""
    if len(m.parent) > MAX_KEY_BYTES:
        raise FrameError(f"parent key longer than {MAX_KEY_BYTES} bytes")
    try:
        return BlockMeta(
            source=m.source,
            importance=m.importance,
            ttl_s=m.ttl_s or None,
            protected=m.protected,
            parent=m.parent,
            tokens=unpack_tokens(m.tokens),
        )
    except ValueError as exc:
        raise FrameError(f"bad block metadata: {exc}") from None


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    end = len(buf)
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise FrameError("truncated or oversized varint in frame")


def frame_parts(header: pb.FrameHeader, parts: Sequence[Buffer], body_len: int | None = None) -> list[Buffer]:
    """One Frame as a gather list: the serialized header fields, then the body parts untouched
    (``body_len``: their total length, where the caller has it already)."""
    head = header.SerializeToString()
    if body_len is None:
        body_len = sum(len(p) for p in parts)
    return [b"".join([b"\x0a", _varint(len(head)), head, b"\x12", _varint(body_len)]), *parts]


def build_frame(header: pb.FrameHeader, parts: Sequence[Buffer]) -> bytes:
    """Serialize one Frame: the header through protobuf, the body parts by a single join."""
    return b"".join(frame_parts(header, parts))


def parse_frame(data: Buffer) -> tuple[pb.FrameHeader, memoryview]:
    """Split one Frame into its header and a zero-copy view of its body."""
    view = memoryview(data).cast("B")
    header = pb.FrameHeader()
    try:
        body = _split(view, header)
        if body is not None:
            return header, body
        frame = pb.Frame.FromString(bytes(view))
    except DecodeError as exc:
        raise FrameError(f"not a tierkv.v1.Frame: {exc}") from exc
    return frame.header, memoryview(frame.body)


def _split(view: memoryview, header: pb.FrameHeader) -> memoryview | None:
    """The body of a frame laid out as tierkv writes it (header field, then body field), parsing the
    header into ``header``; None for any other valid layout, which the full parser then reads."""
    if len(view) < 2 or view[0] != 0x0A:
        return None
    head_len, pos = _read_varint(view, 1)
    head_end = pos + head_len
    if head_end > len(view):
        raise FrameError("frame header runs past the end of the frame")
    header.ParseFromString(bytes(view[pos:head_end]))
    if head_end == len(view):
        return _EMPTY
    if view[head_end] != 0x12:
        return None
    body_len, body_pos = _read_varint(view, head_end + 1)
    return view[body_pos:] if body_pos + body_len == len(view) else None


def read_frame_head(read: Callable[[int], Buffer], length: int) -> tuple[pb.FrameHeader, int] | bytes:
    """Read only the head of a ``length``-byte Frame through ``read(n)`` (exactly ``n`` bytes): its
    header and its body's length, so that the receiver can choose where the body goes before a byte of
    it is read. A frame not laid out as tierkv writes it returns the bytes read so far instead; the caller
    reads the rest and parses the whole frame with :func:`parse_frame`."""
    peek = bytes(read(min(length, _HEAD_PEEK)))
    if len(peek) < 2 or peek[0] != 0x0A:
        return peek
    head_len, pos = _read_varint(memoryview(peek), 1)
    head_end = pos + head_len
    body_len = _body_len(length - head_end - 1)
    if body_len is None:
        return peek
    prefix_len = length - body_len
    if prefix_len < len(peek):
        return peek
    prefix = peek + bytes(read(prefix_len - len(peek)))
    if prefix[head_end] != 0x12 or prefix[head_end + 1 :] != _varint(body_len):
        return prefix
    header = pb.FrameHeader()
    try:
        header.ParseFromString(prefix[pos:head_end])
    except DecodeError as exc:
        raise FrameError(f"not a tierkv.v1.Frame: {exc}") from exc
    return header, body_len


def split_body(body: Buffer, header: pb.FrameHeader) -> list[memoryview]:
    """Each segment's piece of a frame's body (zero-copy slices), in order."""
    view, pos, pieces = memoryview(body).cast("B"), 0, []
    for seg in header.segments:
        pieces.append(view[pos : pos + seg.length])
        pos += seg.length
    return pieces


_HEAD_PEEK = 6
"""Bytes that hold a Frame's first tag and its header length whatever that is."""


def _body_len(rest: int) -> int | None:
    """The body length ``n`` with ``len(varint(n)) + n == rest``, if any."""
    for width in range(1, 11):
        n = rest - width
        if n >= 0 and len(_varint(n)) == width:
            return n
    return None


def encode_frames(blobs: Iterable[Blob], *, frame_bytes: int, namespace: bytes = b"") -> Iterator[bytes]:
    """Pack blobs into frames whose body is at most ``frame_bytes``; larger blobs span several frames.

    Whole blobs are never split needlessly: a blob that fits in an empty frame starts a new frame rather
    than straddling two, so the receiver can hand it on as a zero-copy slice.
    """
    for parts in encode_frame_parts(blobs, frame_bytes=frame_bytes, namespace=namespace):
        yield b"".join(parts)


def encode_frame_parts(
    blobs: Iterable[Blob], *, frame_bytes: int, namespace: bytes = b""
) -> Iterator[list[Buffer]]:
    """Like :func:`encode_frames`, but each frame as a gather list that still points into the blobs
    (for scatter-gather sends that never copy the payload in Python)."""
    if frame_bytes <= 0:
        raise ValueError("frame_bytes must be positive")
    header = pb.FrameHeader(namespace=namespace)
    parts: list[Buffer] = []
    used = 0

    def flush() -> list[Buffer]:
        nonlocal header, parts, used
        frame = frame_parts(header, parts)
        header, parts, used = pb.FrameHeader(), [], 0
        return frame

    for blob in blobs:
        data = _EMPTY if blob.data is None else memoryview(blob.data).cast("B")
        size = len(data)
        if used and (used + size > frame_bytes and size <= frame_bytes):
            yield flush()
        offset = 0
        while True:
            if len(header.segments) >= MAX_SEGMENTS_PER_FRAME or (used >= frame_bytes and offset < size):
                yield flush()
            take = min(size - offset, frame_bytes - used)
            seg = header.segments.add(
                key=blob.key,
                index=blob.index,
                status=blob.status,
                size=size,
                length=take,
                priority=blob.priority,
            )
            if blob.meta is not None and offset == 0:
                seg.meta.CopyFrom(meta_to_pb(blob.meta))
            if take:
                parts.append(data[offset : offset + take])
            used += take
            offset += take
            if offset >= size:
                break
    if header.segments or header.namespace:
        yield flush()


class FrameDecoder:
    """Reassembles blobs from a stream of frames, validating every size against the limits given.

    Complete blobs that arrived inside one frame are memoryview slices of that frame (valid as long as the
    caller keeps them); blobs that spanned frames are reassembled into a ``bytearray``.
    """

    def __init__(self, *, max_item_bytes: int, max_total_bytes: int | None = None) -> None:
        self.max_item_bytes = max_item_bytes
        self.max_total_bytes = max_total_bytes
        self.namespace: bytes | None = None
        self.total_bytes = 0
        self.frames = 0
        self._partial: Blob | None = None
        self._partial_size = 0
        self._partial_buf = bytearray()
        self._partial_meta: pb.BlockMeta | None = None

    def feed(self, frame: Buffer) -> list[Blob]:
        header, body = parse_frame(frame)
        self.check(header, len(body))
        return self.take(header, split_body(body, header))

    def check(self, header: pb.FrameHeader, body_len: int) -> None:
        """Validate a frame's header against its body length and the limits before any of its body is
        used (a receiver that places bodies itself calls this before reading them)."""
        if self.frames == 0:
            self.namespace = header.namespace
        elif header.namespace and header.namespace != self.namespace:
            raise FrameError("namespace changed within one call")
        self.frames += 1
        if len(self.namespace or b"") > MAX_NAMESPACE_BYTES:
            raise FrameError(f"namespace longer than {MAX_NAMESPACE_BYTES} bytes")
        pos = 0
        for seg in header.segments:
            if not seg.key or len(seg.key) > MAX_KEY_BYTES:
                raise FrameError(f"key length {len(seg.key)} outside 1..{MAX_KEY_BYTES}")
            if seg.length > seg.size or pos + seg.length > body_len:
                raise FrameError("segment lengths do not match the frame body")
            if seg.size > self.max_item_bytes:
                raise FrameLimitError(f"blob of {seg.size} bytes exceeds the limit of {self.max_item_bytes}")
            pos += seg.length
            self.total_bytes += seg.length
            if self.max_total_bytes is not None and self.total_bytes > self.max_total_bytes:
                raise FrameLimitError(f"call carries more than {self.max_total_bytes} bytes")
        if pos != body_len:
            raise FrameError("frame body longer than its segments")

    def take(self, header: pb.FrameHeader, pieces: Sequence[memoryview]) -> list[Blob]:
        """The blobs a :meth:`check`-ed frame completes, given each segment's piece of the body."""
        out: list[Blob] = []
        for seg, piece in zip(header.segments, pieces, strict=True):
            done = self._take(seg, piece)
            if done is not None:
                out.append(done)
        return out

    @property
    def midway(self) -> bool:
        """Whether a blob that spans frames is still being reassembled."""
        return self._partial is not None

    def _take(self, seg: pb.Segment, piece: memoryview) -> Blob | None:
        if self._partial is not None:
            return self._continue(self._partial, seg, piece)
        blob = Blob(key=seg.key, data=None, index=seg.index, status=seg.status, priority=seg.priority)
        if seg.HasField("meta"):
            blob.meta = meta_from_pb(seg.meta)
        if seg.status in (MISSING, CORRUPT, REJECTED):
            if seg.size or seg.length:
                raise FrameError("a missing blob cannot carry bytes")
            return blob
        if seg.length == seg.size:
            blob.data = piece
            return blob
        self._partial, self._partial_size, self._partial_buf = blob, seg.size, bytearray(piece)
        self._partial_meta = seg.meta if seg.HasField("meta") else None
        return None

    def _continue(self, partial: Blob, seg: pb.Segment, piece: memoryview) -> Blob | None:
        """The next piece of the blob that spans frames; it must name the same blob, size included."""
        if (seg.key, seg.index, seg.status, seg.size) != (
            partial.key,
            partial.index,
            partial.status,
            self._partial_size,
        ):
            raise FrameError("a blob that spans frames was interrupted by another key")
        if seg.HasField("meta") and seg.meta != self._partial_meta:
            raise FrameError("a blob that spans frames changed its metadata")
        self._partial_buf += piece
        if len(self._partial_buf) > seg.size:
            raise FrameError("the pieces of a blob add up to more than its size")
        if len(self._partial_buf) < seg.size:
            return None
        partial.data, self._partial, self._partial_buf = self._partial_buf, None, bytearray()
        return partial

    def close(self) -> None:
        """Raise if the stream ended in the middle of a blob."""
        if self._partial is not None:
            raise FrameError("stream ended in the middle of a blob")


__all__ = [
    "CORRUPT",
    "FOUND",
    "MAX_KEY_BYTES",
    "MAX_NAMESPACE_BYTES",
    "MAX_SEGMENTS_PER_FRAME",
    "MISSING",
    "REJECTED",
    "STORED",
    "Blob",
    "Buffer",
    "FrameDecoder",
    "FrameError",
    "FrameLimitError",
    "build_frame",
    "encode_frame_parts",
    "encode_frames",
    "frame_parts",
    "meta_from_pb",
    "meta_to_pb",
    "parse_frame",
    "read_frame_head",
    "split_body",
]
