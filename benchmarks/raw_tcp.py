"""The bare-TCP contender of the read benchmarks: N bytes over one fresh connection, the wire's ceiling.

The server is a child process (``server_command``) that prints its port, then, per connection, reads an
8-byte length and sends that many bytes; a length of 0 stops it.
"""

from __future__ import annotations

import socket
import struct
import sys
from collections.abc import Callable

SERVER = r"""
import os, socket, struct, sys
src = memoryview(os.urandom(int(sys.argv[2])))
srv = socket.socket(); srv.bind((sys.argv[1], 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    left = struct.unpack("!Q", conn.recv(8, socket.MSG_WAITALL))[0]
    if not left:
        break
    pos = 0
    while left:
        n = min(left, len(src) - pos); conn.sendall(src[pos : pos + n]); left -= n; pos = (pos + n) % len(src)
    conn.close()
"""


def server_command(host: str, source_bytes: int = 4 << 20) -> list[str]:
    """The server bound to ``host`` on a free port, which it prints as its first line. It sends from a
    buffer of ``source_bytes`` (over and over): 4 MiB stays in cache, the wire's best case; a round's size
    reads as much memory as the vault's reply does."""
    return [sys.executable, "-c", SERVER, host, str(source_bytes)]


def tcp_pull(host: str, port: int, rtt: Callable[[], None] = lambda: None) -> Callable[[int], None]:
    """``pull(N)``: ``N`` bytes from the server, after ``rtt()`` (one round trip of an emulated link)."""
    buf = memoryview(bytearray(4 << 20))

    def pull(nbytes: int) -> None:
        rtt()
        with socket.create_connection((host, port)) as s:
            s.sendall(struct.pack("!Q", nbytes))
            left = nbytes
            while left:
                got = s.recv_into(buf, min(left, len(buf)))
                if not got:
                    raise RuntimeError("tcp server closed early")
                left -= got

    return pull


def stop_server(host: str, port: int) -> None:
    with socket.create_connection((host, port)) as s:
        s.sendall(struct.pack("!Q", 0))
