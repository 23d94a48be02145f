from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv import limits
from tierkv.wire import Blob, FrameDecoder, FrameError, encode_frames, pb
from tierkv.wire.framing import (
    MAX_KEY_BYTES,
    MAX_NAMESPACE_BYTES,
    MISSING,
    FrameLimitError,
    build_frame,
    parse_frame,
    read_frame_head,
)


def roundtrip(blobs: list[Blob], frame_bytes: int) -> tuple[list[Blob], int]:
    frames = list(encode_frames(blobs, frame_bytes=frame_bytes, namespace=b"ns"))
    dec = FrameDecoder(max_item_bytes=1 << 30)
    out: list[Blob] = []
    for f in frames:
        out.extend(dec.feed(f))
    dec.close()
    assert dec.namespace == b"ns"
    return out, len(frames)


@pytest.mark.parametrize("frame_bytes", [1, 7, 1000, 1 << 20])
def test_blobs_survive_any_frame_size(frame_bytes: int) -> None:
    blobs = [
        Blob(key=f"k{i}".encode(), data=os.urandom(n), index=i) for i, n in enumerate([0, 1, 999, 5000, 3])
    ]
    out, _ = roundtrip(blobs, frame_bytes)
    assert [(b.key, b.index, bytes(b.data or b"")) for b in out] == [
        (b.key, b.index, bytes(b.data or b"")) for b in blobs
    ]


def test_whole_blobs_are_not_split_when_they_fit() -> None:
    blobs = [Blob(key=bytes([i + 1]), data=b"x" * 600, index=i) for i in range(4)]
    frames = list(encode_frames(blobs, frame_bytes=1000))
    assert len(frames) == 4
    for f in frames:
        header, body = parse_frame(f)
        assert [s.length for s in header.segments] == [600] and len(body) == 600


def test_frames_are_valid_protobuf() -> None:
    frame = next(encode_frames([Blob(key=b"k", data=b"payload")], frame_bytes=100, namespace=b"ns"))
    parsed = pb.Frame.FromString(frame)
    assert parsed.body == b"payload" and parsed.header.namespace == b"ns"
    assert parsed.header.segments[0].key == b"k"


def test_decoder_accepts_frames_built_by_plain_protobuf() -> None:
    header = pb.FrameHeader(namespace=b"n")
    header.segments.add(key=b"a", index=0, status=pb.FOUND, size=3, length=3)
    frame = pb.Frame(header=header, body=b"abc").SerializeToString()
    [blob] = FrameDecoder(max_item_bytes=10).feed(frame)
    assert bytes(blob.data or b"") == b"abc"


def test_missing_entries_carry_no_bytes() -> None:
    frame = build_frame(pb.FrameHeader(segments=[pb.Segment(key=b"a", status=MISSING)]), [])
    [blob] = FrameDecoder(max_item_bytes=10).feed(frame)
    assert blob.status == MISSING and blob.data is None
    bad = build_frame(
        pb.FrameHeader(segments=[pb.Segment(key=b"a", status=MISSING, size=1, length=1)]), [b"x"]
    )
    with pytest.raises(FrameError):
        FrameDecoder(max_item_bytes=10).feed(bad)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xff" * 20,
        b"\x0a\x05abc",
        b"\x0a\x02\x12\x05\x12\x09abc",
        os.urandom(64) + b"\xff\xff\xff\xff\xff\xff",
    ],
    # named, not shown: the random case differs per process, and parallel workers must collect the same ids
    ids=["all-ones", "short-field", "nested-short-field", "random"],
)
def test_garbage_is_a_frame_error(garbage: bytes) -> None:
    with pytest.raises(FrameError):
        FrameDecoder(max_item_bytes=1 << 20).feed(garbage)


def test_body_and_segments_must_agree() -> None:
    header = pb.FrameHeader(segments=[pb.Segment(key=b"a", size=10, length=10)])
    with pytest.raises(FrameError, match="segment lengths"):
        FrameDecoder(max_item_bytes=100).feed(build_frame(header, [b"short"]))
    with pytest.raises(FrameError, match="longer than"):
        FrameDecoder(max_item_bytes=100).feed(build_frame(header, [b"x" * 12]))


def test_limits_are_errors_not_truncation() -> None:
    frames = list(encode_frames([Blob(key=b"k", data=b"x" * 100)], frame_bytes=30))
    dec = FrameDecoder(max_item_bytes=50)
    with pytest.raises(FrameLimitError):
        dec.feed(frames[0])
    dec = FrameDecoder(max_item_bytes=1000, max_total_bytes=64)
    with pytest.raises(FrameLimitError):
        for f in frames:
            dec.feed(f)


def test_stream_ending_mid_blob_is_detected() -> None:
    frames = list(encode_frames([Blob(key=b"k", data=b"x" * 100)], frame_bytes=30))
    dec = FrameDecoder(max_item_bytes=1000)
    for f in frames[:-1]:
        dec.feed(f)
    with pytest.raises(FrameError, match="middle of a blob"):
        dec.close()


def test_interleaved_continuation_is_rejected() -> None:
    first = build_frame(pb.FrameHeader(segments=[pb.Segment(key=b"a", size=10, length=5)]), [b"12345"])
    other = build_frame(pb.FrameHeader(segments=[pb.Segment(key=b"b", size=5, length=5)]), [b"12345"])
    dec = FrameDecoder(max_item_bytes=100)
    dec.feed(first)
    with pytest.raises(FrameError, match="interrupted"):
        dec.feed(other)


# -- properties (hypothesis) ------------------------------------------------------------------------

keys_st = st.binary(min_size=1, max_size=MAX_KEY_BYTES)
blobs_st = st.lists(st.tuples(keys_st, st.binary(max_size=3000)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(blobs=blobs_st, frame_bytes=st.integers(1, 5000), namespace=st.binary(max_size=MAX_NAMESPACE_BYTES))
def test_any_blobs_survive_any_frame_size(
    blobs: list[tuple[bytes, bytes]], frame_bytes: int, namespace: bytes
) -> None:
    sent = [Blob(key=k, data=d, index=i) for i, (k, d) in enumerate(blobs)]
    frames = list(encode_frames(sent, frame_bytes=frame_bytes, namespace=namespace))
    dec = FrameDecoder(max_item_bytes=1 << 20)
    got = [b for f in frames for b in dec.feed(f)]
    dec.close()
    assert [(b.key, b.index, bytes(b.data or b"")) for b in got] == [
        (k, i, d) for i, (k, d) in enumerate(blobs)
    ]
    assert all(len(parse_frame(f)[1]) <= frame_bytes for f in frames)


def decode_or_frame_error(frames: list[bytes], dec: FrameDecoder) -> None:
    """Decode a whole call; the only exception allowed is FrameError."""
    try:
        for f in frames:
            dec.feed(f)
        dec.close()
    except FrameError:
        pass


@settings(max_examples=500, deadline=None)
@given(frames=st.lists(st.binary(max_size=200), min_size=1, max_size=4))
def test_arbitrary_bytes_raise_only_frame_error(frames: list[bytes]) -> None:
    decode_or_frame_error(frames, FrameDecoder(max_item_bytes=1 << 20, max_total_bytes=1 << 20))


@settings(max_examples=300, deadline=None)
@given(blobs=blobs_st, data=st.data())
def test_damaged_frames_raise_only_frame_error(blobs: list[tuple[bytes, bytes]], data: st.DataObject) -> None:
    sent = [Blob(key=k, data=d, index=i) for i, (k, d) in enumerate(blobs)]
    frames = list(encode_frames(sent, frame_bytes=data.draw(st.integers(1, 4000)), namespace=b"ns"))
    if not frames:
        return
    n = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[n])
    head = min(len(frame), 64)  # most damage lands in the header, where the parsing is
    cut = data.draw(st.integers(0, head) | st.integers(0, len(frame)))
    for pos in data.draw(st.lists(st.integers(0, head - 1) | st.integers(0, len(frame) - 1), max_size=4)):
        frame[pos] = data.draw(st.integers(0, 255))
    frames[n] = bytes(frame[:cut] if data.draw(st.booleans()) else frame)
    decode_or_frame_error(frames, FrameDecoder(max_item_bytes=1 << 20))


def test_a_header_longer_than_its_frame_is_a_frame_error() -> None:
    """``0a 10`` claims a 16-byte header in a 2-byte frame (this raised IndexError)."""
    with pytest.raises(FrameError, match="past the end"):
        parse_frame(b"\x0a\x10")
    with pytest.raises(FrameError):
        FrameDecoder(max_item_bytes=10).feed(b"\x0a\x10")


def test_a_continuation_must_keep_the_blob_size() -> None:
    first = build_frame(pb.FrameHeader(segments=[pb.Segment(key=b"a", size=10, length=5)]), [b"12345"])
    grown = build_frame(pb.FrameHeader(segments=[pb.Segment(key=b"a", size=8, length=3)]), [b"678"])
    dec = FrameDecoder(max_item_bytes=100)
    dec.feed(first)
    with pytest.raises(FrameError):
        dec.feed(grown)


def test_pieces_beyond_the_blob_size_are_a_frame_error() -> None:
    first = build_frame(pb.FrameHeader(segments=[pb.Segment(key=b"a", size=10, length=5)]), [b"12345"])
    over = build_frame(pb.FrameHeader(segments=[pb.Segment(key=b"a", size=10, length=8)]), [b"67890123"])
    dec = FrameDecoder(max_item_bytes=100)
    dec.feed(first)
    with pytest.raises(FrameError, match="more than its size"):
        dec.feed(over)


def test_namespace_and_key_limits_come_from_the_shared_module() -> None:
    assert (MAX_KEY_BYTES, MAX_NAMESPACE_BYTES) == (limits.MAX_KEY_BYTES, limits.MAX_NAMESPACE_BYTES)


class Reads:
    """Exact reads from a byte string, as a transport's reader makes them."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def __call__(self, n: int) -> bytes:
        assert self.pos + n <= len(self.data), "read past the frame"
        self.pos += n
        return self.data[self.pos - n : self.pos]


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=3000), max_size=6),
    frame_bytes=st.integers(min_value=1, max_value=5000),
)
def test_read_frame_head_reads_exactly_the_head_of_tierkv_frames(sizes: list[int], frame_bytes: int) -> None:
    blobs = [Blob(key=b"k%d" % i, data=os.urandom(n), index=i) for i, n in enumerate(sizes)]
    for frame in encode_frames(blobs, frame_bytes=frame_bytes, namespace=b"ns"):
        reads = Reads(frame)
        head = read_frame_head(reads, len(frame))
        header, body = parse_frame(frame)
        assert isinstance(head, tuple), "tierkv's own layout is read head first"
        assert head == (header, len(body)) and reads.pos == len(frame) - len(body)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_read_frame_head_of_any_bytes_agrees_with_the_full_parser_or_falls_back(data: bytes) -> None:
    reads = Reads(data)
    try:
        head = read_frame_head(reads, len(data))
    except FrameError:
        return
    if isinstance(head, tuple):
        header, body = parse_frame(data)
        assert head == (header, len(body))
    else:
        assert head == data[: reads.pos], "a fallback hands back exactly the bytes it read"


def test_a_frame_written_by_plain_protobuf_falls_back_to_the_full_parser() -> None:
    header = pb.FrameHeader(segments=[pb.Segment(key=b"k", size=3, length=3)])
    head_bytes = header.SerializeToString()
    frame = b"\x12\x03abc" + b"\x0a" + bytes([len(head_bytes)]) + head_bytes  # valid, body field first
    reads = Reads(frame)
    head = read_frame_head(reads, len(frame))
    assert isinstance(head, bytes) and head == frame[: reads.pos]
    [blob] = FrameDecoder(max_item_bytes=10).feed(head + frame[reads.pos :])
    assert bytes(blob.data or b"") == b"abc"
