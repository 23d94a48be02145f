"""Loopback ports for tests that cannot let the process under test pick its own, safe under parallel
workers and beside other test runs.

A vault reports the port it bound (``--port 0`` and its ready file), so most tests never choose one. A
port that another process must bind (a metrics port, an HTTP server's port, a port written in a docs
page) is drawn at random *below* the kernel's ephemeral range and checked free by binding it: the usual
trick, binding port 0 and closing the socket, hands out an ephemeral port that any ``connect()`` on the
machine may take before the child binds it, and with two workers each opening hundreds of connections
that happens. A port where nothing may listen is held by a bound socket that never listens: connecting to
it is refused for as long as the test holds it.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOWEST = 15_000
"""The lowest port drawn: above the registered ports most services are configured on."""

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_draw = random.SystemRandom()


def ephemeral_start() -> int:
    """The first port the kernel hands to ``connect()`` and ``bind(0)`` (Linux reads it from /proc; the
    IANA range, 49152, elsewhere)."""
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49_152


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports on 127.0.0.1 that nothing has bound right now, outside the ephemeral range."""
    top = ephemeral_start()
    if top - LOWEST < 1_000:  # a machine whose ephemeral range starts low: let the kernel choose
        return _kernel_ports(n)
    chosen: list[int] = []
    for _ in range(100 * n):
        port = _draw.randrange(LOWEST, top)
        if port not in chosen and _bindable(port):
            chosen.append(port)
            if len(chosen) == n:
                return chosen
    raise RuntimeError(f"no {n} free ports in {LOWEST}..{top - 1}")


def free_port() -> int:
    """One port on 127.0.0.1 for a child process to bind (see :func:`free_ports`)."""
    return free_ports(1)[0]


@contextmanager
def refusing_port() -> Iterator[int]:
    """A port on 127.0.0.1 where connections are refused while the block runs: bound here, never
    listened on, so no other process can start listening there meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
