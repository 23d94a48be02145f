"""The vault side of tierkv-bulk/1 (see :mod:`tierkv.wire.bulk`): BatchGet over a plain TCP socket.

Each connection gets a thread that reads a request, checks the token in constant time, and sends the
reply's frames with ``sendmsg`` directly from the LMDB views (the kernel's copy is the only one). The
same :class:`~tierkv.vault.service.VaultService` answers as for gRPC, so validation, metrics, checksums
and recency are shared; a bad request gets an ERROR record and the connection is closed, the vault keeps
serving. ``stop`` refuses new work and waits for replies in flight before the store may close.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import itertools
import logging
import socket
import threading
import time
from collections.abc import Sequence

import grpc

from tierkv.vault.service import Abort, VaultService, parse_message
from tierkv.wire import bulk, pb
from tierkv.wire.framing import Buffer

log = logging.getLogger(__name__)

_IOV_MAX = 512
_IDLE_TIMEOUT_S = 300.0
_IO_TIMEOUT_S = 30.0


class BulkServer:
    def __init__(
        self, service: VaultService, host: str, port: int, *, token: str | None, max_connections: int = 64
    ) -> None:
        self.service = service
        self._expected = (token or "").encode()
        self._max_connections = max_connections
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host.strip("[]"), port))
        except OSError:
            self._listener.close()
            raise
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Condition()
        self._connections: set[socket.socket] = set()
        self._busy = 0
        self._stopping = False
        self._acceptor = threading.Thread(target=self._accept, name="tierkv-bulk-accept", daemon=True)

    def start(self) -> None:
        self._acceptor.start()

    def stop(self, grace: float) -> None:
        """Stop accepting, let replies in flight finish (up to ``grace`` s), then drop every connection."""
        with self._lock:
            self._stopping = True
        self._listener.close()
        deadline = time.monotonic() + grace
        with self._lock:
            self._lock.wait_for(lambda: self._busy == 0, timeout=max(0.0, deadline - time.monotonic()))
            for conn in self._connections:
                _quiet_shutdown(conn)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._stopping or len(self._connections) >= self._max_connections:
                    conn.close()
                    continue
                self._connections.add(conn)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), name="tierkv-bulk", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while self._one_request(conn):
                pass
        except OSError as exc:
            log.debug("bulk connection ended: %s", exc)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _one_request(self, conn: socket.socket) -> bool:
        """Serve one request; False when the connection should close."""
        conn.settimeout(_IDLE_TIMEOUT_S)
        head = _recv_exact(conn, bulk.REQUEST_HEAD.size)
        if head is None:
            return False
        conn.settimeout(_IO_TIMEOUT_S)
        with self._lock:
            if self._stopping:
                _send_error(conn, grpc.StatusCode.UNAVAILABLE, "vault is shutting down")
                return False
            self._busy += 1
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            request = self._read_request(conn, head)
            self.service.check_serving()
            for parts in self.service.batch_get_parts(request):
                _send_all(conn, [bulk.record(bulk.FRAME, sum(len(p) for p in parts)), *parts])
            conn.sendall(bulk.record(bulk.END, 0))
            return True
        except Abort as exc:
            code = exc.code
            log.info("bulk request refused: %s %s", exc.code.name, exc.details)
            _send_error(conn, exc.code, exc.details)
            return False
        finally:
            self.service.observe("BatchGet", code, start)
            with self._lock:
                self._busy -= 1
                self._lock.notify_all()

    def _read_request(self, conn: socket.socket, head: bytes) -> pb.BatchGetRequest:
        try:
            token_len = bulk.parse_request_head(head)
        except (bulk.BulkProtocolError, ValueError) as exc:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        token = _recv_exact(conn, token_len) or b""
        size_raw = _recv_exact(conn, bulk.LENGTH.size)
        if size_raw is None:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "truncated request")
        (size,) = bulk.LENGTH.unpack(size_raw)
        if self._expected and not hmac.compare_digest(token, self._expected):
            raise Abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
        if size > bulk.MAX_REQUEST_BYTES:
            raise Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"request of {size} bytes is over the limit")
        body = _recv_exact(conn, size) if size else b""
        if body is None:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "truncated request")
        return parse_message(pb.BatchGetRequest, body)


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes, or None when the peer closed before sending any of them."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = conn.recv_into(view[got:])
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError("peer closed mid-message")
        got += k
    return bytes(buf)


def _send_all(conn: socket.socket, buffers: Sequence[Buffer]) -> None:
    """Scatter-gather send of every byte of ``buffers`` (sendmsg may stop early; resume where it did)."""
    pending = collections.deque(memoryview(b).cast("B") for b in buffers if len(b))
    while pending:
        sent = conn.sendmsg(list(itertools.islice(pending, _IOV_MAX)))
        while sent and pending:
            head = pending[0]
            if sent >= len(head):
                sent -= len(head)
                pending.popleft()
            else:
                pending[0] = head[sent:]
                sent = 0


def _send_error(conn: socket.socket, code: grpc.StatusCode, details: str) -> None:
    payload = bulk.error_payload(code.name, details)
    with contextlib.suppress(OSError):
        conn.sendall(bulk.record(bulk.ERROR, len(payload)) + payload)


def _quiet_shutdown(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
