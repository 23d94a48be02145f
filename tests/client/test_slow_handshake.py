"""A vault that is slow to answer a new connection (a busy machine, a long link) is still reached within
the call's deadline: gRPC gives each connection attempt at least ``grpc.min_reconnect_backoff_ms``, so that
setting must not be shortened to speed up reconnects."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tierkv import VaultClient
from tierkv.vault.launcher import VaultProcess


def _pump(src: socket.socket, dst: socket.socket, hold_s: float) -> None:
    """Copy ``src`` to ``dst`` until either ends, holding the first bytes for ``hold_s``."""
    with contextlib.suppress(OSError):
        first = True
        while data := src.recv(1 << 16):
            if first:
                time.sleep(hold_s)  # the slowness this relay stands for
                first = False
            dst.sendall(data)
    for sock in (src, dst):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@contextmanager
def late_answering(port: int, hold_s: float) -> Iterator[int]:
    """A loopback relay to ``port`` whose answers on each new connection start ``hold_s`` late (the
    vault's HTTP/2 SETTINGS among them); the port of the relay."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    stop = threading.Event()
    socks: list[socket.socket] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection(("127.0.0.1", port), timeout=30)
            conn.settimeout(30)
            socks.extend((conn, upstream))
            threading.Thread(target=_pump, args=(conn, upstream, 0.0), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, conn, hold_s), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        acceptor.join(5)
        listener.close()
        for sock in socks:
            sock.close()


def test_a_vault_slow_to_answer_a_new_connection_is_reached_within_the_deadline(vault: VaultProcess) -> None:
    with (
        late_answering(vault.port, hold_s=0.5) as port,
        VaultClient(f"127.0.0.1:{port}", timeout=10.0, bulk=False) as client,
    ):
        client.put(b"ns", {b"k": b"v"})
        assert client.get(b"ns", [b"k"]) == [b"v"]
