"""Retention metadata on the wire: it rides on a blob's first segment, survives any framing, costs nothing
for untagged blobs, and every bad value is a FrameError (the vault's INVALID_ARGUMENT)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.limits import MAX_KEY_BYTES
from tierkv.retention import BlockMeta
from tierkv.retention.classes import MAX_SOURCE_BYTES, MAX_TTL_S
from tierkv.wire import Blob, FrameDecoder, FrameError, encode_frames, pb
from tierkv.wire.framing import _varint, build_frame, meta_from_pb

metas = st.builds(
    BlockMeta,
    source=st.text(st.characters(codec="utf-8", categories=["L", "N", "P"]), max_size=16),
    importance=st.floats(0.0, 1.0),
    ttl_s=st.one_of(st.none(), st.floats(1e-3, MAX_TTL_S)),
    protected=st.booleans(),
    parent=st.binary(max_size=64),
)


def decode(frames: list[bytes]) -> list[Blob]:
    dec = FrameDecoder(max_item_bytes=1 << 30)
    out = [b for f in frames for b in dec.feed(f)]
    dec.close()
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=300), st.one_of(st.none(), metas)), min_size=1, max_size=8),
    st.integers(1, 400),
)
def test_metadata_survives_any_framing(items: list[tuple[bytes, BlockMeta | None]], frame_bytes: int) -> None:
    blobs = [Blob(key=b"k%d" % i, data=d, index=i, meta=m) for i, (d, m) in enumerate(items)]
    out = decode(list(encode_frames(blobs, frame_bytes=frame_bytes, namespace=b"ns")))
    assert [(b.key, bytes(b.data or b""), b.meta) for b in out] == [
        (b.key, bytes(b.data or b""), b.meta) for b in blobs
    ]


def test_untagged_blobs_cost_nothing_extra() -> None:
    blobs = [Blob(key=b"k%d" % i, data=b"x" * 100, index=i) for i in range(10)]
    frames = list(encode_frames(blobs, frame_bytes=1 << 20, namespace=b"ns"))
    header = pb.FrameHeader(namespace=b"ns")
    for b in blobs:
        header.segments.add(key=b.key, index=b.index, status=pb.FOUND, size=100, length=100)
    assert frames == [build_frame(header, [b"x" * 100] * 10)]  # byte for byte what a client sent before


def test_a_spanning_blob_carries_its_metadata_once() -> None:
    meta = BlockMeta("tools", 0.7, ttl_s=60.0, parent=b"p")
    frames = list(encode_frames([Blob(key=b"k", data=b"y" * 1000, meta=meta)], frame_bytes=100))
    headers = [pb.Frame.FromString(f).header for f in frames]
    assert [h.segments[0].HasField("meta") for h in headers] == [True] + [False] * 9
    assert decode(frames)[0].meta == meta


def _spanning(first: pb.BlockMeta, later: pb.BlockMeta | None) -> list[bytes]:
    frames = []
    for i, meta in enumerate((first, later)):
        header = pb.FrameHeader(namespace=b"ns" if i == 0 else b"")
        seg = header.segments.add(key=b"k", status=pb.FOUND, size=8, length=4)
        if meta is not None:
            seg.meta.CopyFrom(meta)
        frames.append(build_frame(header, [b"abcd"]))
    return frames


def test_a_continuation_may_repeat_but_not_change_the_metadata() -> None:
    m = pb.BlockMeta(source="rules", importance=0.9)
    assert decode(_spanning(m, m))[0].meta == BlockMeta("rules", 0.9)
    assert decode(_spanning(m, None))[0].meta == BlockMeta("rules", 0.9)
    with pytest.raises(FrameError, match="changed its metadata"):
        decode(_spanning(m, pb.BlockMeta(source="rules", importance=0.1)))


BAD = [
    pb.BlockMeta(importance=math.nan),
    pb.BlockMeta(importance=1.5),
    pb.BlockMeta(importance=-0.1),
    pb.BlockMeta(ttl_s=-1.0),
    pb.BlockMeta(ttl_s=math.inf),
    pb.BlockMeta(ttl_s=math.nan),
    pb.BlockMeta(ttl_s=MAX_TTL_S * 2),
    pb.BlockMeta(source="x" * (MAX_SOURCE_BYTES + 1)),
    pb.BlockMeta(source="bad\nname"),
    pb.BlockMeta(parent=b"p" * (MAX_KEY_BYTES + 1)),
]


@pytest.mark.parametrize("meta", BAD, ids=lambda m: str(m).replace("\n", " ")[:40])
def test_bad_values_are_frame_errors(meta: pb.BlockMeta) -> None:
    header = pb.FrameHeader(namespace=b"ns")
    header.segments.add(key=b"k", status=pb.FOUND, size=1, length=1, meta=meta)
    with pytest.raises(FrameError):
        decode([build_frame(header, [b"z"])])


@settings(max_examples=300, deadline=None)
@given(
    source=st.text(max_size=80),
    importance=st.floats(allow_nan=True, allow_infinity=True),
    ttl_s=st.floats(allow_nan=True, allow_infinity=True),
    parent=st.binary(max_size=1100),
)
def test_any_metadata_parses_or_is_a_frame_error(
    source: str, importance: float, ttl_s: float, parent: bytes
) -> None:
    m = pb.BlockMeta(source=source, importance=importance, ttl_s=ttl_s, parent=parent)
    try:
        meta = meta_from_pb(m)
    except FrameError:
        return
    assert 0.0 <= meta.importance <= 1.0
    assert meta.ttl_s is None or 0 < meta.ttl_s <= MAX_TTL_S
    assert len(meta.source.encode()) <= MAX_SOURCE_BYTES and len(meta.parent) <= MAX_KEY_BYTES


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_in_the_metadata_field_is_a_frame_error(garbage: bytes) -> None:
    """Arbitrary bytes as field 7 of a segment: parsed and checked, or refused — nothing else escapes."""
    seg = pb.Segment(key=b"k", status=pb.FOUND, size=1, length=1).SerializeToString() + _field(7, garbage)
    head = pb.FrameHeader(namespace=b"ns").SerializeToString() + _field(2, seg)
    try:
        blobs = decode([_field(1, head) + _field(2, b"z")])
    except FrameError:
        return
    assert blobs[0].meta is None or 0.0 <= blobs[0].meta.importance <= 1.0
