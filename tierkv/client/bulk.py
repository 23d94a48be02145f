"""The client side of tierkv-bulk/1 (see :mod:`tierkv.wire.bulk`): BatchGet replies over a plain socket.

A small pool of connections per vault; each reply's frames are read with ``recv_into`` into one buffer per
frame and handed to the same :class:`~tierkv.client._rpc.GetAssembler` as gRPC replies, so blobs come back
as zero-copy slices. Every read runs against the call's deadline. Failures are the tierkv exceptions:
``VaultUnavailable`` (``code`` ``CONNECT`` when no connection could be made, so the caller may fall back to
gRPC; ``DEADLINE_EXCEEDED`` when the vault was too slow), or whatever status the vault's ERROR names.
"""

from __future__ import annotations

import socket
import threading
import time

from tierkv.client._rpc import GetAssembler, error_for
from tierkv.errors import VaultError, VaultUnavailable
from tierkv.wire import bulk

_MAX_IDLE = 4


class BulkChannel:
    def __init__(self, host: str, port: int, *, token: str | None, address: str) -> None:
        self.host = host.strip("[]")
        self.port = port
        self.address = address
        self._token = token
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    def batch_get(self, request: bytes, assembler: GetAssembler, *, timeout: float) -> None:
        """Send one BatchGetRequest and feed every frame of the reply to ``assembler``.

        A pooled connection the vault has since closed fails before any reply byte arrives; that case is
        retried once on a fresh connection.
        """
        deadline = time.monotonic() + timeout
        sock, pooled = self._take(timeout)
        started = False
        try:
            _set_deadline(sock, deadline)
            sock.sendall(bulk.encode_request(self._token, request))
            while True:
                kind, length = bulk.RECORD.unpack(self._read(sock, bulk.RECORD.size, deadline))
                started = True
                if kind == bulk.END:
                    break
                payload = self._read(sock, length, deadline)
                if kind == bulk.ERROR:
                    raise error_for(*bulk.parse_error(bytes(payload)), self.address)
                if kind != bulk.FRAME:
                    raise VaultError(f"bulk reply record of unknown kind {kind}", address=self.address)
                assembler.feed(payload, self.address)
        except TimeoutError:
            sock.close()
            raise VaultUnavailable(
                "DEADLINE_EXCEEDED: bulk reply too slow", address=self.address, code="DEADLINE_EXCEEDED"
            ) from None
        except OSError as exc:
            sock.close()
            if pooled and not started:
                self.batch_get(request, assembler, timeout=max(0.0, deadline - time.monotonic()))
                return
            raise VaultUnavailable(
                f"UNAVAILABLE: bulk connection lost: {exc}", address=self.address, code="UNAVAILABLE"
            ) from None
        except BaseException:
            sock.close()
            raise
        self._give(sock)

    def _take(self, timeout: float) -> tuple[socket.socket, bool]:
        """A connection and whether it came from the pool."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            raise VaultUnavailable(
                f"CONNECT: bulk port {self.port}: {exc}", address=self.address, code="CONNECT"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, False

    def _give(self, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < _MAX_IDLE:
                self._idle.append(sock)
                return
        sock.close()

    @staticmethod
    def _read(sock: socket.socket, n: int, deadline: float) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            _set_deadline(sock, deadline)
            k = sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError("vault closed the bulk connection mid-reply")
            got += k
        return buf

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()


def _set_deadline(sock: socket.socket, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    sock.settimeout(remaining)
