"""Scatter-gather sends and receives over a blocking socket, shared by both ends of tierkv-bulk/1.

Both ends send frames as gather lists that still point into the blobs (LMDB's map on the vault, the
caller's blobs on the client), so no payload is joined in Python. This is the wire layer's one helper that
touches a socket; it keeps no state.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import socket
import sys
from collections.abc import Callable, Sequence

from tierkv.wire.framing import Buffer

IOV_MAX = 512
"""Buffers per ``sendmsg`` or ``recvmsg_into`` (Linux accepts 1024; half leaves room)."""
RCVLOWAT_MAX = 256 * 1024
"""A receive waits until this much (or all that is still due) has arrived before it wakes the reader."""


def _wait_for(sock: socket.socket, n: int) -> int:
    """Have ``sock`` wake its reader only once ``n`` bytes are there (``SO_RCVLOWAT``: Linux's ``poll``
    and receive honour it for TCP, capping it at half the receive buffer), so a reply arriving over a
    link at line rate costs a wake-up per ``n`` bytes instead of one per few packets; ``n``, so that the
    caller does not ask again for the same. Elsewhere, and where it is refused, it stays at 1.

    Linux grows the receive buffer to hold ``n`` and clamps the window to it for the moment; receive
    autotuning raises both past it as the transfer goes on (Linux 6.18, loopback: an 8.6 MB window after
    64 MiB, 1.7 MB without the option), so the window of a link with a long round trip is not held
    there."""
    if _LOWAT and sock.type == socket.SOCK_STREAM:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)
    return n


_LOWAT = sys.platform.startswith("linux") and hasattr(socket, "SO_RCVLOWAT")


def pending(buffers: Sequence[Buffer]) -> collections.deque[memoryview]:
    """The non-empty buffers as byte views, ready for :func:`advance`."""
    return collections.deque(memoryview(b).cast("B") for b in buffers if len(b))


def advance(queue: collections.deque[memoryview], sent: int) -> None:
    """Drop the ``sent`` bytes a ``sendmsg`` took from the front of ``queue``."""
    while sent and queue:
        head = queue[0]
        if sent >= len(head):
            sent -= len(head)
            queue.popleft()
        else:
            queue[0] = head[sent:]
            sent = 0


def send_all(
    sock: socket.socket, buffers: Sequence[Buffer], before: Callable[[], None] | None = None
) -> None:
    """Send every byte of ``buffers`` in order; ``before`` runs ahead of each ``sendmsg`` (a caller sets
    the socket's timeout from its deadline there), so a slow but moving peer is served and one that stops
    for longer than the timeout is dropped."""
    queue = pending(buffers)
    while queue:
        if before is not None:
            before()
        advance(queue, sock.sendmsg(list(itertools.islice(queue, IOV_MAX))))


def recv_all(
    sock: socket.socket,
    buffers: Sequence[memoryview],
    before: Callable[[], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Fill every byte of ``buffers`` in order from ``sock`` (``recvmsg_into``: a blob received straight
    into the rows of a cache, no copy after the socket). ``before`` as in :func:`send_all`; ``progress``
    is told each receive's byte count as it comes (so a caller knows whether any byte came before a
    failure). The peer closing first is a :class:`ConnectionResetError`."""
    queue = pending(buffers)
    left = sum(len(b) for b in queue)
    lowat = 0
    while queue:
        if before is not None:
            before()
        want = min(left, RCVLOWAT_MAX)
        if want != lowat:
            lowat = _wait_for(sock, want)
        got = sock.recvmsg_into(list(itertools.islice(queue, IOV_MAX)))[0]
        if got == 0:
            raise ConnectionResetError("the peer closed the connection mid-message")
        if progress is not None:
            progress(got)
        advance(queue, got)
        left -= got
