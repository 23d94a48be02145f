"""Receiving BatchGet blobs straight into a sink's memory (:mod:`tierkv.codec.landing`), at unit level:
the assembler's frame reading, and the cluster read's hand-over bookkeeping."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import pytest

from tests.client.test_cluster import closing
from tierkv.client._rpc import GetAssembler
from tierkv.client.cluster import _EachRead
from tierkv.errors import VaultError
from tierkv.wire import Blob, encode_frames
from tierkv.wire.framing import MISSING, Buffer


class Reader:
    """A :class:`~tierkv.client._rpc.FrameReader` over bytes; ``fail_into`` breaks the scattered read."""

    def __init__(self, data: bytes, fail_into: bool = False) -> None:
        self.data, self.pos, self.fail_into = data, 0, fail_into
        self.scattered = 0

    def read(self, n: int) -> Buffer:
        self.pos += n
        return memoryview(bytearray(self.data[self.pos - n : self.pos]))

    def read_into(self, buffers: Sequence[memoryview]) -> None:
        if self.fail_into:
            raise ConnectionResetError("gone mid-frame")
        self.scattered += 1
        for b in buffers:
            b[:] = self.data[self.pos : self.pos + len(b)]
            self.pos += len(b)


class Landing:
    def __init__(self, size: int) -> None:
        self.memory = bytearray(size)
        self.buffers = [memoryview(self.memory)[: size // 2], memoryview(self.memory)[size // 2 :]]
        self.ends: list[str] = []

    def landed(self) -> None:
        self.ends.append("landed")

    def abandon(self) -> None:
        self.ends.append("abandoned")


class Sink:
    """Lands the keys in ``lands``, takes the others as buffers; ``short`` offers a byte too few."""

    def __init__(self, lands: set[int], short: bool = False) -> None:
        self.lands, self.short = lands, short
        self.landings: dict[int, Landing] = {}
        self.handed: dict[int, bytes] = {}

    def __call__(self, i: int, blob: Buffer) -> None:
        self.handed[i] = bytes(blob)

    def land(self, i: int, size: int) -> Landing | None:
        if i not in self.lands:
            return None
        self.landings[i] = Landing(size - self.short)
        return self.landings[i]


def receive_all(assembler: GetAssembler, frames: list[bytes], **reader: bool) -> list[Reader]:
    readers = []
    for frame in frames:
        readers.append(Reader(frame, **reader))
        assembler.receive(readers[-1], len(frame))
        assert readers[-1].pos == len(frame), "exactly the frame was read"
    return readers


def test_landed_blobs_are_in_the_sinks_memory_and_the_others_are_handed_over() -> None:
    data = [os.urandom(n) for n in (100, 3000, 7, 2500)]
    blobs = [Blob(key=b"k%d" % i, data=d, index=i) for i, d in enumerate(data)]
    blobs.insert(2, Blob(key=b"gone", data=None, index=4, status=MISSING))
    sink = Sink({0, 3, 4})
    assembler = GetAssembler(5, "peer:1", sink)
    receive_all(assembler, list(encode_frames(blobs, frame_bytes=4096, namespace=b"ns")))
    assembler.finish()
    assert sorted(sink.landings) == [0, 3] and sorted(sink.handed) == [1, 2]
    for i in (0, 3):
        assert bytes(sink.landings[i].memory) == data[i] and sink.landings[i].ends == ["landed"]
    assert sink.handed == {1: data[1], 2: data[2]}
    assert assembler.sizes == [100, 3000, 7, 2500, None]


def test_a_blob_that_spans_frames_is_handed_over_not_landed() -> None:
    """Nor is anything else in a frame that ends a blob still being reassembled."""
    data = os.urandom(10_000)
    sink = Sink({0, 1})
    assembler = GetAssembler(2, "peer:1", sink)
    blobs = [Blob(key=b"big", data=data, index=0), Blob(key=b"small", data=b"xy", index=1)]
    frames = list(encode_frames(blobs, frame_bytes=4096, namespace=b"ns"))
    assert len(frames) >= 3
    receive_all(assembler, frames)
    assembler.finish()
    assert sink.handed == {0: data, 1: b"xy"} and sink.landings == {}


def test_a_frame_cut_short_abandons_its_landings_and_fails_the_get() -> None:
    sink = Sink({0, 1})
    assembler = GetAssembler(2, "peer:1", sink)
    blobs = [Blob(key=b"a", data=b"one", index=0), Blob(key=b"b", data=b"two", index=1)]
    [frame] = encode_frames(blobs, frame_bytes=4096, namespace=b"ns")
    with pytest.raises(ConnectionResetError):
        assembler.receive(Reader(frame, fail_into=True), len(frame))
    assert [sink.landings[i].ends for i in (0, 1)] == [["abandoned"], ["abandoned"]]
    assert assembler.sizes == [None, None]


def test_a_cluster_read_closes_only_after_a_landing_in_progress_ends() -> None:
    """A landing writes into the caller's memory until it ends, so ``close`` (the get returning) waits
    for it; one that ends once the read is closing is abandoned, its key not reported, as a blob handed
    over then would not be."""
    sink = Sink({0, 1})
    read = _EachRead(b"ns", [b"a", b"b"], [[0], [0]], sink)
    landing = read.land(0, 0, 4)
    assert landing is not None
    closer = closing(read)
    landing.landed()
    closer.join(10)
    assert not closer.is_alive() and read.results == [None, None]
    assert sink.landings[0].ends == ["abandoned"]
    assert read.land(0, 1, 4) is None, "no landing once the read is over"


def test_a_cluster_read_lands_only_keys_with_one_owner_and_records_their_size() -> None:
    sink = Sink({0, 1})
    read = _EachRead(b"ns", [b"a", b"b"], [[0], [0, 1]], sink)
    landing = read.land(0, 0, 4)
    assert landing is not None and read.land(0, 1, 4) is None
    landing.landed()
    assert read.results == [4, None] and sink.landings[0].ends == ["landed"]
    assert read.land(0, 0, 4) is None, "a key that landed is not landed twice"


def test_a_landing_of_the_wrong_size_is_abandoned_and_the_blob_handed_over() -> None:
    sink = Sink({0}, short=True)
    assembler = GetAssembler(1, "peer:1", sink)
    receive_all(assembler, list(encode_frames([Blob(key=b"k", data=b"abcd", index=0)], frame_bytes=64)))
    assert sink.landings[0].ends == ["abandoned"] and sink.handed == {0: b"abcd"}


KEY = Blob(key=b"k", data=b"abcd", index=0)


@pytest.mark.parametrize(
    ("blobs", "match", "ends"),
    [
        ([Blob(key=b"k", data=b"abcd", index=0), Blob(key=b"k", data=b"other", index=0)], "twice", "landed"),
        (
            [Blob(key=b"stray", data=b"zz", index=5), Blob(key=b"k", data=b"abcd", index=0)],
            "not asked",
            "abandoned",
        ),
    ],
    ids=["a key named twice", "a key not asked for before it"],
)
def test_a_malformed_reply_fails_and_every_landing_in_it_ends(
    blobs: list[Blob], match: str, ends: str
) -> None:
    """Every landing ends, landed or abandoned, whatever the reply holds (a cluster read waits for it);
    a second copy of a landed key is refused, not handed over."""
    sink = Sink({0})
    assembler = GetAssembler(1, "peer:1", sink)
    with pytest.raises(VaultError, match=match):
        receive_all(assembler, list(encode_frames(blobs, frame_bytes=4096, namespace=b"ns")))
    assert sink.landings[0].ends == [ends] and sink.handed == {}
    assert ends == "abandoned" or bytes(sink.landings[0].memory) == b"abcd"


def test_an_abandoned_landing_ends_its_hand_over_and_reports_nothing() -> None:
    sink = Sink({0})
    read = _EachRead(b"ns", [b"a"], [[0]], sink)
    landing = read.land(0, 0, 4)
    assert landing is not None
    landing.abandon()
    closer = threading.Thread(target=read.close)
    closer.start()
    closer.join(5)
    assert not closer.is_alive(), "an abandoned landing still held the read open"
    assert read.results == [None] and sink.landings[0].ends == ["abandoned"]
