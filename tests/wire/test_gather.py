"""Scatter-gather sends (both ends of tierkv-bulk/1): the bookkeeping of partial sends, and real sockets."""

from __future__ import annotations

import os
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.wire import Blob, gather
from tierkv.wire.framing import encode_frame_parts, encode_frames


@settings(max_examples=500, deadline=None)
@given(
    buffers=st.lists(st.binary(max_size=40), max_size=8),
    sends=st.lists(st.integers(min_value=0, max_value=50), max_size=12),
)
def test_advance_keeps_exactly_the_unsent_suffix(buffers: list[bytes], sends: list[int]) -> None:
    whole = b"".join(buffers)
    queue = gather.pending(buffers)
    sent = 0
    for wanted in sends:
        n = min(wanted, len(whole) - sent)
        gather.advance(queue, n)
        sent += n
        assert b"".join(bytes(v) for v in queue) == whole[sent:]
        assert all(len(v) for v in queue), "no empty view is left to send"


def test_send_all_delivers_every_byte_of_many_buffers_through_a_small_socket_buffer() -> None:
    buffers = [os.urandom(n) for n in (1, 70_000, 0, 3, 1 << 20)] * 300  # more than IOV_MAX buffers
    left, right = socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    received = bytearray()

    def drain() -> None:
        while chunk := right.recv(1 << 16):
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    calls = []
    with left:
        gather.send_all(left, buffers, lambda: calls.append(1))
    reader.join(30)
    right.close()
    assert bytes(received) == b"".join(buffers)
    assert len(calls) >= 2, "the deadline hook runs before every sendmsg"


def test_gather_lists_carry_the_same_bytes_as_joined_frames() -> None:
    blobs = [
        Blob(key=b"a", data=os.urandom(5000)),
        Blob(key=b"b", data=os.urandom(3000)),
        Blob(key=b"c", data=b""),
    ]
    joined = list(encode_frames(blobs, frame_bytes=4096, namespace=b"ns"))
    gathered = [b"".join(parts) for parts in encode_frame_parts(blobs, frame_bytes=4096, namespace=b"ns")]
    assert joined == gathered


def test_recv_all_fills_many_small_buffers_in_order_and_reports_progress() -> None:
    whole = os.urandom(300_000)
    sizes = [0, 7, 1, 64] * 2000  # more than IOV_MAX buffers, and more than IOV_MAX of them hold
    buffers, pos = [], 0
    for wanted in sizes:
        n = min(wanted, len(whole) - pos)
        buffers.append(memoryview(bytearray(n)))
        pos += n
    buffers.append(memoryview(bytearray(len(whole) - pos)))
    left, right = socket.socketpair()
    sender = threading.Thread(target=lambda: (left.sendall(whole), left.close()))
    sender.start()
    seen: list[int] = []
    with right:
        gather.recv_all(right, buffers, progress=seen.append)
    sender.join(30)
    assert b"".join(bytes(b) for b in buffers) == whole
    assert sum(seen) == len(whole) and len(seen) >= 2


def test_recv_all_reports_a_peer_that_closes_mid_message_and_what_came_before() -> None:
    left, right = socket.socketpair()
    left.sendall(b"abc")
    left.close()
    seen: list[int] = []
    with right, pytest.raises(ConnectionResetError):
        gather.recv_all(right, [memoryview(bytearray(2)), memoryview(bytearray(5))], progress=seen.append)
    assert sum(seen) == 3


def test_a_receive_over_tcp_wakes_once_a_large_piece_is_there_not_per_packet() -> None:
    """SO_RCVLOWAT: with the first kilobyte of a 1 MiB message there and the rest coming 0.2 s later,
    the first receive hands over (at least) RCVLOWAT_MAX bytes, not the kilobyte; a message shorter than
    that is woken for once it is whole."""
    if not gather._LOWAT:
        pytest.skip("SO_RCVLOWAT is used on Linux only")
    whole = os.urandom(1 << 20)
    with socket.create_server(("127.0.0.1", 0)) as server:
        left = socket.create_connection(server.getsockname()[:2])
        right, _ = server.accept()
    rest_may_go = threading.Event()

    def send() -> None:
        with left:
            left.sendall(whole[:1024])
            rest_may_go.wait(0.2)  # a reader woken by the first kilobyte lets the rest go at once
            left.sendall(whole[1024:])

    sender = threading.Thread(target=send)
    sender.start()
    seen: list[int] = []

    def progress(n: int) -> None:
        seen.append(n)
        rest_may_go.set()

    buf = memoryview(bytearray(len(whole)))
    with right:
        gather.recv_all(right, [buf], before=lambda: right.settimeout(10), progress=progress)
    sender.join(30)
    assert bytes(buf) == whole
    assert seen[0] >= gather.RCVLOWAT_MAX, f"woken for {seen[0]} bytes"
