"""The vault side of tierkv-bulk/1 (see :mod:`tierkv.wire.bulk`): BatchGet, Put and PrefixLookup over a
plain TCP socket.

Each connection gets a thread that reads a request head and token, authenticates in the same call scope
as gRPC (so validation, auth, metrics and rejection logging are shared), and only then reads the body: an
unauthenticated peer never gets a body buffered. The call is admitted (:mod:`.admission`) once its body
is in, so a peer that stalls mid-request holds no slot another call could run in. Request bodies count
against a vault-wide budget of in-flight bytes. Reply frames go out with ``sendmsg`` straight from LMDB's
map, also while the peer is briefly behind; once the read transaction has lived
:data:`~tierkv.vault.store.READ_TXN_MAX_S` or a map resize waits, the rest of the frame is copied and the
transaction ends (:mod:`tierkv.vault.reply`), so a slow reader never holds LMDB back for longer. A bad
request gets an ERROR record and the connection is closed; the vault keeps serving.

Connections are capped below the process's file limit. At the cap the longest-idle connection is closed
to make room (clients retry a dropped pooled connection); when every connection is busy the newcomer gets
an ERROR record (RESOURCE_EXHAUSTED). Idle connections are closed after ``idle_timeout_s``.
``stop`` refuses new work and waits for replies in flight before the store may close.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import resource
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from tierkv.endpoints import bare_host, join_host_port
from tierkv.limits import MAX_BULK_REQUEST_BYTES, MiB
from tierkv.vault.memory import InflightBudget
from tierkv.vault.reply import BatchGetReply
from tierkv.vault.service import M, VaultService, parse_message
from tierkv.vault.status import Abort, Status, invalid
from tierkv.wire import bulk, gather, pb
from tierkv.wire.framing import Buffer

log = logging.getLogger(__name__)

_IO_TIMEOUT_S = 30.0
_RECV_CHUNK = 1 * MiB
_LINGER_S = 2.0
_LINGER_BYTES = 256 * MiB
_WAIT_SLICE_MS = 10
"""How long a sender waits for room at a time before it asks again whether it may keep waiting."""
_FD_RESERVE = 128
"""File descriptors kept for everything but bulk connections (LMDB, gRPC, logs, metrics)."""


@dataclasses.dataclass(frozen=True)
class BulkLimits:
    max_connections: int = 1024
    idle_timeout_s: float = 120.0
    max_inflight_bytes: int = 256 * MiB
    """Request bytes buffered at once over every connection."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free one); OSError when it cannot bind."""
    bare = bare_host(host)
    sock = socket.socket(socket.AF_INET6 if ":" in bare else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bare, port))
        sock.listen(512)
    except OSError:
        sock.close()
        raise
    return sock


def connection_cap(requested: int) -> int:
    """``requested``, lowered to fit the file limit after raising the soft limit toward the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = requested + _FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return requested
    cap = max(1, min(requested, soft - _FD_RESERVE))
    if cap < requested:
        log.warning(
            "bulk connections capped at %d (file limit %d; raise LimitNOFILE / ulimit -n for %d)",
            cap,
            soft,
            requested,
        )
    return cap


class _Conn:
    """One accepted connection: whether a request is in progress, and when the last one began.

    The longest-idle connection is the one whose last request began first. That time is taken when the
    request's head arrives, before its answer is sent, so a client that sees the answer and opens another
    connection always finds the first one older (a time taken when the serving thread next waits would
    race with the client)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.busy = False
        self.last_request = time.monotonic()


class BulkServer:
    def __init__(
        self, service: VaultService, listener: socket.socket, *, limits: BulkLimits | None = None
    ) -> None:
        self.service = service
        self.limits = limits or BulkLimits()
        self.max_connections = connection_cap(self.limits.max_connections)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._lock = threading.Condition()
        self._connections: dict[socket.socket, _Conn] = {}
        self._busy = 0
        self._stopping = False
        self._budget = InflightBudget(
            self.limits.max_inflight_bytes,
            what="the bulk port",
            tenants=len(service.store.tenant_names),
            on_large=service.calls.memory.large_call_ended,
        )
        self._acceptor = threading.Thread(target=self._accept, name="tierkv-bulk-accept", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return join_host_port(host, port)

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
            for sock in self._connections:
                _quiet_shutdown(sock)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            if not self._admit(sock):
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(sock,), name="tierkv-bulk", daemon=True).start()

    def _admit(self, sock: socket.socket) -> bool:
        """Room for ``sock``: under the cap, or by closing the longest-idle connection."""
        with self._lock:
            if self._stopping:
                sock.close()
                return False
            if len(self._connections) >= self.max_connections:
                idle = [c for c in self._connections.values() if not c.busy]
                if not idle:
                    _refuse(sock, f"all {self.max_connections} bulk connections are busy")
                    self.service.calls.rejects.note("BulkConnect", Status.RESOURCE_EXHAUSTED, "busy")
                    return False
                oldest = min(idle, key=lambda c: c.last_request)
                del self._connections[oldest.sock]
                _quiet_shutdown(oldest.sock)
            self._connections[sock] = _Conn(sock)
            return True

    def _serve(self, sock: socket.socket) -> None:
        try:
            while self._one_request(sock):
                pass
        except OSError as exc:
            log.debug("bulk connection ended: %s", exc)
        finally:
            with self._lock:
                self._connections.pop(sock, None)
            sock.close()

    def _set_idle(self, sock: socket.socket, idle: bool) -> bool:
        """Mark the connection idle or busy; False if it was reaped meanwhile."""
        with self._lock:
            conn = self._connections.get(sock)
            if conn is None:
                return False
            conn.busy = not idle
            if not idle:
                conn.last_request = time.monotonic()
            return True

    def _one_request(self, sock: socket.socket) -> bool:
        """Serve one request; False when the connection should close."""
        sock.settimeout(self.limits.idle_timeout_s)
        if not self._set_idle(sock, True):
            return False
        try:
            head = _recv_exact(sock, bulk.REQUEST_HEAD.size)
        except TimeoutError:
            return False
        if head is None or not self._set_idle(sock, False):
            return False
        sock.settimeout(_IO_TIMEOUT_S)
        with self._lock:
            if self._stopping:
                _send_error(sock, Status.UNAVAILABLE, "vault is shutting down")
                return False
            self._busy += 1
        try:
            return self._answer(sock, head)
        finally:
            with self._lock:
                self._busy -= 1
                self._lock.notify_all()

    def _answer(self, sock: socket.socket, head: bytes) -> bool:
        op = bulk.OP_BATCH_GET
        try:
            op, token = self._read_token(sock, head)
            if op == bulk.OP_PUT:
                self._answer_put(sock, token)
            elif op == bulk.OP_PREFIX_LOOKUP:
                self._answer_lookup(sock, token)
            else:
                self._answer_get(sock, token)
            sock.sendall(bulk.record(bulk.END, 0))
            return True
        except Abort as exc:
            _send_error(sock, exc.status, exc.details)
            if op == bulk.OP_PUT:
                _linger(sock)
            return False

    def _answer_get(self, sock: socket.socket, token: bytes) -> None:
        calls, conn = self.service.calls, _connection(sock)
        with calls.scope("BatchGet", token, conn, admit=False) as who:
            request = self._read_body(sock, pb.BatchGetRequest, who.tenant)
            with calls.admission.admit(who.tenant, conn):
                reply = self.service.batch_get(who, request)
                try:
                    for parts in reply.frames():
                        _send_frame(sock, [bulk.record(bulk.FRAME, reply.frame_len), *parts], reply)
                finally:
                    self.service.finish_batch_get(reply)

    def _answer_put(self, sock: socket.socket, token: bytes) -> None:
        """A Put: its frames are read whole (against the in-flight budget) before the store is touched, so a
        slow sender never holds the write lock; the reply is one FRAME with the ``PutReply``."""
        calls, conn = self.service.calls, _connection(sock)
        with calls.scope("Put", token, conn, admit=False) as who:
            body = _PutBody(sock, self._budget, who.tenant, self.service.limits.max_message_bytes)
            try:
                batch = self.service.read_put(body.frames())
                with calls.admission.admit(who.tenant, conn):
                    reply = self.service.store_put(who, batch).SerializeToString()
            finally:
                self._budget.give(body.held, who.tenant)
        sock.sendall(bulk.record(bulk.FRAME, len(reply)) + reply)

    def _answer_lookup(self, sock: socket.socket, token: bytes) -> None:
        """A PrefixLookup, answered as gRPC answers it; the reply is one FRAME with the reply message."""
        calls, conn = self.service.calls, _connection(sock)
        with calls.scope("PrefixLookup", token, conn, admit=False) as who:
            request = self._read_body(sock, pb.PrefixLookupRequest, who.tenant)
            with calls.admission.admit(who.tenant, conn):
                reply = self.service.prefix_lookup(who, request).SerializeToString()
        sock.sendall(bulk.record(bulk.FRAME, len(reply)) + reply)

    @staticmethod
    def _read_token(sock: socket.socket, head: bytes) -> tuple[int, bytes]:
        try:
            op, token_len = bulk.parse_request_head(head)
        except (bulk.BulkProtocolError, ValueError) as exc:
            raise invalid(str(exc)) from exc
        token = _recv_exact(sock, token_len) if token_len else b""
        if token is None:
            raise invalid("truncated request")
        return op, token

    def _read_body(self, sock: socket.socket, message: type[M], tenant: str) -> M:
        """The request body, read in chunks against the in-flight budget (after the token was checked)."""
        size_raw = _recv_exact(sock, bulk.LENGTH.size)
        if size_raw is None:
            raise invalid("truncated request")
        (size,) = bulk.LENGTH.unpack(size_raw)
        if size > MAX_BULK_REQUEST_BYTES:
            raise Abort(Status.RESOURCE_EXHAUSTED, f"request of {size} bytes is over the limit")
        chunks: list[bytes] = []
        held = 0
        try:
            while held < size:
                n = min(_RECV_CHUNK, size - held)
                self._budget.take(n, tenant)
                held += n
                chunk = _recv_exact(sock, n)
                if chunk is None:
                    raise invalid("truncated request")
                chunks.append(chunk)
            body = b"".join(chunks)
            chunks.clear()
            return parse_message(message, body)
        finally:
            self._budget.give(held, tenant)


class _PutBody:
    """The frames of one Put request as they are read; ``held`` bytes of them count against the budget
    until the caller gives them back (after the store has written them)."""

    def __init__(
        self, sock: socket.socket, budget: InflightBudget, tenant: str, max_frame_bytes: int
    ) -> None:
        self.sock = sock
        self.budget = budget
        self.tenant = tenant
        self.max_frame_bytes = max_frame_bytes
        self.held = 0

    def frames(self) -> Iterator[memoryview]:
        while True:
            head = _recv_exact(self.sock, bulk.RECORD.size)
            if head is None:
                raise invalid("truncated request")
            try:
                kind, length = bulk.parse_request_record(head)
            except bulk.BulkProtocolError as exc:
                raise invalid(str(exc)) from exc
            if kind == bulk.END:
                return
            if length > self.max_frame_bytes:
                raise Abort(Status.RESOURCE_EXHAUSTED, f"a frame of {length} bytes is over max_message_bytes")
            yield self._frame(length)

    def _frame(self, length: int) -> memoryview:
        """One frame's bytes, received straight into a buffer of its own (not zero-filled first),
        budgeted chunk by chunk as they arrive so a trickling sender holds only what it sent."""
        view = _unfilled(length)
        got = 0
        while got < length:
            n = min(_RECV_CHUNK, length - got)
            self.budget.take(n, self.tenant)
            self.held += n
            k = self.sock.recv_into(view[got : got + n])
            if k == 0:
                raise invalid("truncated request")
            self.budget.give(n - k, self.tenant)
            self.held -= n - k
            got += k
        return view


def _unfilled(length: int) -> memoryview:
    """A writable buffer of ``length`` bytes that is not zero-filled first (``bytearray`` would write
    every byte once before ``recv_into`` writes it again). numpy's; imported on the first bulk Put, not at
    start-up, where its import was a fifth of a vault's start (most of a vault's start is imports)."""
    import numpy as np

    return np.empty(length, dtype=np.uint8).data.cast("B")


def _connection(sock: socket.socket) -> str:
    """The name admission counts this connection's calls by (unique among open connections)."""
    return f"bulk {sock.fileno()}"


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes, or None when the peer closed before sending any of them."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError("peer closed mid-message")
        got += k
    return bytes(buf)


def _send_frame(sock: socket.socket, frame: list[Buffer], reply: BatchGetReply) -> None:
    """One reply frame, straight from LMDB's map while the reply may stay pinned there (the peer keeps up,
    or is behind for less than the read transaction may live); past that, the rest is copied, the read
    transaction ends, and the copy goes out as the peer takes it."""
    rest = _send_while(sock, frame, lambda: reply.pinned and not reply.stale)
    if rest:
        if reply.pinned:
            copy = b"".join(rest)
            reply.release()  # never wait on a slow peer inside a read transaction
            rest = [memoryview(copy)]
        gather.send_all(sock, rest)


def _send_while(
    sock: socket.socket, buffers: Sequence[Buffer], may_wait: Callable[[], bool]
) -> list[memoryview]:
    """Send what the socket takes; when it is full, wait for room in slices of ``_WAIT_SLICE_MS`` for as
    long as ``may_wait()`` says. The unsent rest (empty when all went out)."""
    queue = gather.pending(buffers)
    timeout = sock.gettimeout()
    sock.setblocking(False)
    poller: select.poll | None = None
    try:
        while queue:
            try:
                gather.advance(queue, sock.sendmsg(list(itertools.islice(queue, gather.IOV_MAX))))
                continue
            except BlockingIOError:
                if not may_wait():
                    break
            if poller is None:
                poller = select.poll()
                poller.register(sock, select.POLLOUT)
            poller.poll(_WAIT_SLICE_MS)
    finally:
        sock.settimeout(timeout)
    return list(queue)


def _send_error(sock: socket.socket, status: Status, details: str) -> None:
    payload = bulk.error_payload(status.name, details)
    with contextlib.suppress(OSError):
        sock.sendall(bulk.record(bulk.ERROR, len(payload)) + payload)


def _linger(sock: socket.socket) -> None:
    """After refusing a Put part-way: stop sending and drop what the client still sends, for at most
    ``_LINGER_S`` and ``_LINGER_BYTES``, so that it reads the ERROR record. Closed with unread bytes, a
    socket resets the connection, and the client would see a reset instead of the answer (HTTP servers
    close the same way)."""
    deadline = time.monotonic() + _LINGER_S
    left = _LINGER_BYTES
    buf = bytearray(_RECV_CHUNK)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        while left > 0 and (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            n = sock.recv_into(buf)
            if not n:
                return
            left -= n


def _refuse(sock: socket.socket, details: str) -> None:
    """Tell a connection over the cap why, without reading its request (never blocks the acceptor)."""
    sock.setblocking(False)
    _send_error(sock, Status.RESOURCE_EXHAUSTED, details)
    _quiet_shutdown(sock)
    sock.close()


def _quiet_shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
