"""How the bulk port sends a BatchGet reply's frames: straight from LMDB's map while the read transaction
may stay open (the peer keeps up, or is behind for a moment), copied and released once it may not (old,
or a map resize waits). A real store, real reply frames and a real socket pair; the peer is a thread that
starts reading only once the sender found the socket full, so every case below really waits."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierkv.vault.bulk import _send_frame
from tierkv.vault.reply import BatchGetReply
from tierkv.vault.store import Store
from tierkv.wire import FrameDecoder, bulk

BLOB = 1 << 20
KEYS = [f"k{i}".encode() for i in range(6)]


class Watched:
    """The real reply, with its ``stale`` answer chosen by the test and every release and wait counted;
    the first time the sender asks whether it may wait (its socket is full), the peer starts reading."""

    def __init__(self, reply: BatchGetReply, stale: bool, full: threading.Event) -> None:
        self.reply = reply
        self._stale = stale
        self._full = full
        self.releases = 0
        self.asked = 0

    @property
    def pinned(self) -> bool:
        return self.reply.pinned

    @property
    def stale(self) -> bool:
        self.asked += 1
        self._full.set()
        return self._stale

    def release(self) -> None:
        self.releases += 1
        self.reply.release()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Store, dict[bytes, bytes]]]:
    blobs = {k: os.urandom(BLOB) for k in KEYS}
    with Store(tmp_path / "v", 64 << 20, sync_mode="fast") as s:
        s.put_many(b"ns", [(k, v, 0) for k, v in blobs.items()])
        yield s, blobs


def _serve(store: Store, *, stale: bool) -> tuple[Watched, dict[bytes, bytes]]:
    """Send one reply for every key over a socket pair whose peer waits until the socket is full; the
    reply as sent and the blobs the peer decoded from what it received."""
    sender, peer = socket.socketpair()
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sender.settimeout(10)
    full = threading.Event()
    got: dict[bytes, bytes] = {}

    def read() -> None:
        full.wait(10)
        decoder = FrameDecoder(max_item_bytes=BLOB)
        with peer:
            while True:
                kind, length = bulk.parse_record(peer.recv(bulk.RECORD.size, socket.MSG_WAITALL))
                if kind == bulk.END:
                    break
                for blob in decoder.feed(peer.recv(length, socket.MSG_WAITALL)):
                    got[blob.key] = bytes(blob.data or b"")

    reading = threading.Thread(target=read)
    reading.start()
    reply = BatchGetReply(store.reader(), b"ns", KEYS, frame_bytes=4 * BLOB)
    watched = Watched(reply, stale, full)
    try:
        with sender:
            for parts in reply.frames():
                _send_frame(sender, [bulk.record(bulk.FRAME, reply.frame_len), *parts], watched)  # type: ignore[arg-type]
                assert watched.asked, "the socket never filled: this case did not wait at all"
            sender.sendall(bulk.record(bulk.END, 0))
    finally:
        full.set()
        reading.join(10)
        reply.close()
    return watched, got


def test_a_peer_that_is_behind_for_a_moment_gets_the_frames_straight_from_the_map(
    store: tuple[Store, dict[bytes, bytes]],
) -> None:
    s, blobs = store
    watched, got = _serve(s, stale=False)
    assert got == blobs
    assert watched.releases == 0, "a young transaction was ended (and the frame copied) for a brief wait"


def test_once_the_transaction_may_not_wait_the_rest_is_copied_and_it_ends(
    store: tuple[Store, dict[bytes, bytes]],
) -> None:
    s, blobs = store
    watched, got = _serve(s, stale=True)
    assert got == blobs
    assert watched.releases >= 1
    assert not watched.reply.pinned
