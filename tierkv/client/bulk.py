"""The client side of tierkv-bulk/1 (see :mod:`tierkv.wire.bulk`): BatchGet, Put and PrefixLookup over a
plain socket.

:class:`BulkTransport` keeps a small pool of connections to one vault's bulk port. A BatchGet reply's
frames are read into one buffer per frame and handed to the request's sink, so blobs come back as
zero-copy slices, or, for a sink that offers memory of its own (:mod:`tierkv.codec.landing`), each frame's
head is read first and its blobs are received straight into that memory. A Put's frames go out with
scatter-gather ``sendmsg`` straight from the caller's blobs. Every read and send runs against the call's
deadline.

A vault may close, refuse or reset a connection at any time (its connection limit, idle reaping, a
restart). When that happens before any reply byte, the request is sent once more on a fresh connection;
if the port still refuses, :class:`BulkRefused` says so and :class:`BulkFirst` carries the call over gRPC
instead. A healthy vault therefore never fails a call because of its bulk port. Sending a Put again is
safe: storing the same blobs under the same keys twice leaves what storing them once does.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from tierkv.client._rpc import ClientOptions, FrameReader, PutFrames, error_for, parse_reply
from tierkv.client.transport import BATCH_GET, PREFIX_LOOKUP, PUT, STATS, Request, Transport
from tierkv.endpoints import HostPort
from tierkv.errors import VaultError, VaultUnavailable
from tierkv.limits import MAX_MESSAGE_BYTES
from tierkv.wire import FrameError, bulk, gather, pb
from tierkv.wire.framing import Buffer

log = logging.getLogger(__name__)

_MAX_IDLE = 4
_REFUSING = {"UNAVAILABLE", "RESOURCE_EXHAUSTED"}
"""Statuses of an ERROR record sent instead of any reply that mean "not here, try gRPC"."""
_DISCOVERY_BACKOFF_S = (1.0, 30.0)
"""After the bulk port failed, ask for it again after 1 s, doubling up to 30 s while it keeps failing."""


class BulkRefused(VaultUnavailable):
    """The bulk port answered nothing to this request (connect refused, connection closed or reset before
    the reply, or an ERROR record that refuses service): nothing reached the sink, gRPC may take over."""


RECV_POOL_BYTES = 64 * 1024 * 1024
"""Receive buffers one transport keeps for reuse (a restore of 64 blocks of 512 KiB fits)."""


class RecvPool:
    """Frame buffers handed out again once nothing refers to them any more.

    A fresh buffer per frame costs a zero-fill and cold memory on every reply; a reused one is neither.
    A buffer is reused only when no memoryview, array or tensor over it is alive (Python refuses to
    resize a buffer that has exports, which is the test), so blobs a caller still holds are never
    overwritten. At most ``max_bytes`` are kept; beyond that a frame gets a buffer of its own.
    """

    def __init__(self, max_bytes: int = RECV_POOL_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buffers: list[bytearray] = []
        self._kept = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> memoryview:
        """A writable view of ``n`` bytes (contents undefined until the caller fills them)."""
        with self._lock:
            for buf in self._buffers:
                if len(buf) >= n and _unexported(buf):
                    return memoryview(buf)[:n]
            if self._kept + n > self.max_bytes:
                return memoryview(bytearray(n))
            buf = bytearray(n)
            self._buffers.append(buf)
            self._kept += n
            return memoryview(buf)


def _unexported(buf: bytearray) -> bool:
    """True when nothing holds a view of ``buf``: a buffer with exports cannot be resized. Shrinking by
    one byte and growing back stays within the allocation, so the memory neither moves nor is copied."""
    try:
        last = buf.pop()
    except BufferError:
        return False
    buf.append(last)
    return True


class BulkTransport(Transport):
    """BatchGet, Put and PrefixLookup over one vault's bulk port (other methods are not carried here)."""

    def __init__(
        self,
        endpoint: HostPort,
        *,
        token: str | None,
        address: str,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        takes_put: bool = True,
        takes_lookup: bool = True,
    ) -> None:
        self.endpoint = endpoint
        self.address = address
        self.takes_put = takes_put
        """Whether the vault takes Put on this port (its Stats say ``bulk_put``)."""
        self.takes_lookup = takes_lookup
        """Whether the vault answers PrefixLookup on this port (its Stats say ``bulk_lookup``)."""
        self.max_message_bytes = max_message_bytes
        """The largest Put frame sent, as gRPC holds its messages to the client's limit."""
        self._token = token
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._pool = RecvPool()

    def handle(self, request: Request) -> bytes:
        """Carry one BatchGet (its reply goes to the sink) or Put (its ``PutReply`` is returned)."""
        try:
            return self._attempt(request, self._take())
        except BulkRefused as exc:
            if _answered(request, exc):
                raise
            log.debug("bulk port of %s refused (%s); once more on a fresh connection", self.address, exc)
            return self._attempt(request, self._connect(request))

    def _attempt(self, request: Request, conn: socket.socket | None) -> bytes:
        conn = conn or self._connect(request)
        try:
            wire = _Wire(conn, request.deadline, self.address, self._pool)
            reply = self._exchange(wire, request)
        except BaseException:
            conn.close()
            raise
        self._give(conn)
        return reply

    def _exchange(self, wire: _Wire, request: Request) -> bytes:
        if request.method == BATCH_GET and isinstance(request.body, bytes):
            wire.send([bulk.encode_request(self._token, request.body)])
            read_reply(wire, request.sink)
            return b""
        if request.method == PREFIX_LOOKUP and isinstance(request.body, bytes):
            wire.send([bulk.encode_request(self._token, request.body, bulk.OP_PREFIX_LOOKUP)])
            return _one_frame(wire)
        if request.method == PUT and isinstance(request.body, PutFrames):
            wire.send([bulk.request_head(self._token, bulk.OP_PUT)])
            for parts in request.body.parts():
                size = sum(len(p) for p in parts)
                if size > self.max_message_bytes:
                    limit = self.max_message_bytes
                    details = f"a Put frame of {size} bytes is over max_message_bytes ({limit})"
                    raise error_for("RESOURCE_EXHAUSTED", details, self.address)
                wire.send([bulk.record(bulk.FRAME, size), *parts])
            wire.send([bulk.record(bulk.END, 0)])
            return _one_frame(wire)
        raise ValueError(f"the bulk port carries BatchGet, Put and PrefixLookup only, not {request.method}")

    def _take(self) -> socket.socket | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def _connect(self, request: Request) -> socket.socket:
        try:
            conn = socket.create_connection(
                (self.endpoint.host, self.endpoint.port), timeout=max(request.remaining(), 1e-3)
            )
        except OSError as exc:
            raise _refused(self.address, f"cannot connect to {self.endpoint}: {exc}") from None
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _give(self, conn: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _one_frame(wire: _Wire) -> bytes:
    """The reply of a Put or PrefixLookup: exactly one frame, the reply message."""
    replies: list[bytes] = []
    read_reply(wire, lambda frame: replies.append(bytes(frame)))
    if len(replies) != 1:
        raise VaultError(f"a bulk reply of {len(replies)} frames where one was due", address=wire.address)
    return replies[0]


@runtime_checkable
class FrameReceiver(Protocol):
    """A sink that reads each reply frame itself (:meth:`GetAssembler.receive`), so that it can choose
    where each blob's bytes go before they are read."""

    def receive(self, reader: FrameReader, length: int) -> None: ...


def read_reply(wire: _Wire, sink: Callable[[Buffer], None] | None) -> None:
    """Read one reply up to its END record, handing every frame to ``sink`` (or letting a
    :class:`FrameReceiver` read it).

    Raises :class:`BulkRefused` when nothing of a reply came, ``VaultUnavailable`` (DEADLINE_EXCEEDED, or
    a connection lost mid-reply), the status an ERROR record names, or ``VaultError`` for bytes that are
    not tierkv-bulk/1 — never anything else, whatever the peer sends.
    """
    first = True
    receiver = sink if isinstance(sink, FrameReceiver) else None
    while True:
        kind, length = wire.head()
        if kind == bulk.FRAME and receiver is not None and length:
            receiver.receive(wire, length)
            first = False
            continue
        payload = wire.read(length) if length else b""
        if kind == bulk.END:
            return
        if kind == bulk.ERROR:
            code, details = bulk.parse_error(payload)
            if first and code in _REFUSING:
                raise _refused(wire.address, f"{code}: {details}", code)
            raise error_for(code, details, wire.address)
        first = False
        if sink is not None:
            sink(payload)


class _Wire:
    """One connection's exact sends and reads against a deadline, failing in the tierkv exceptions.
    It is the :class:`FrameReader` of the reply it reads."""

    def __init__(
        self, conn: socket.socket, deadline: float, address: str, pool: RecvPool | None = None
    ) -> None:
        self.conn = conn
        self.deadline = deadline
        self.address = address
        self.received = 0
        self.pool = pool

    def send(self, buffers: Sequence[Buffer]) -> None:
        with self._errors():
            gather.send_all(self.conn, buffers, lambda: _set_deadline(self.conn, self.deadline))

    def head(self) -> tuple[int, int]:
        """The next record's kind and payload length."""
        raw = self._exact(memoryview(bytearray(bulk.RECORD.size)))
        try:
            return bulk.parse_record(raw)
        except FrameError as exc:
            raise VaultError(f"malformed bulk reply: {exc}", address=self.address) from None

    def read(self, n: int) -> memoryview:
        """The next ``n`` bytes, in a reused receive buffer when this reply has a pool."""
        return self._exact(self.pool.take(n) if self.pool is not None else memoryview(bytearray(n)))

    def read_into(self, buffers: Sequence[memoryview]) -> None:
        with self._errors():
            gather.recv_all(self.conn, buffers, lambda: _set_deadline(self.conn, self.deadline), self._count)

    def _count(self, n: int) -> None:
        self.received += n

    def _exact(self, view: memoryview) -> memoryview:
        self.read_into([view])
        return view

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except TimeoutError:
            raise VaultUnavailable(
                "DEADLINE_EXCEEDED: bulk reply too slow", address=self.address, code="DEADLINE_EXCEEDED"
            ) from None
        except OSError as exc:
            if not self.received:
                raise _refused(self.address, str(exc)) from None
            raise VaultUnavailable(
                f"UNAVAILABLE: bulk connection lost mid-reply: {exc}",
                address=self.address,
                code="UNAVAILABLE",
            ) from None


class BulkFirst(Transport):
    """BatchGet, and Put and PrefixLookup where the vault takes them, over the vault's bulk port while it
    offers one; everything else over gRPC.

    The port is asked for once, with a Stats call at the first call it could carry, and kept; only after the
    port refused is it asked for again (after 1 s, then less often while it keeps failing) — meanwhile gRPC
    carries those calls. A refused call itself goes over gRPC in the same call, so it does not fail. A
    vault that predates bulk Put does not say ``bulk_put`` in its Stats; its Puts stay on gRPC, and so do
    the PrefixLookups of one that does not say ``bulk_lookup``.
    """

    def __init__(
        self,
        grpc: Transport,
        address: str,
        options: ClientOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` times when a refused port is asked for again (tests move it instead of waiting)."""
        self._clock = clock
        self._grpc = grpc
        self.address = address
        self._token = options.token
        self._max_message_bytes = options.max_message_bytes
        self._bulk: BulkTransport | None = None
        self._ask_at = 0.0
        self._backoff = _DISCOVERY_BACKOFF_S[0]
        self._lock = threading.Lock()

    @property
    def bulk(self) -> BulkTransport | None:
        """The bulk transport in use, None while BatchGet goes over gRPC."""
        return self._bulk

    @property
    def bulk_put(self) -> bool:
        """Whether Puts go over the bulk port."""
        return self._bulk is not None and self._bulk.takes_put

    def handle(self, request: Request) -> bytes:
        channel = self._bulk_for(request) if request.method in _BULK_METHODS else None
        if channel is not None and _carries(channel, request.method):
            try:
                reply = channel.handle(request)
            except BulkRefused as exc:
                if _answered(request, exc):
                    log.debug("bulk port of %s refused a Put, sent over gRPC: %s", self.address, exc)
                else:
                    log.info("bulk port of %s refused, the call goes over gRPC: %s", self.address, exc)
                    self._forget(channel)
            else:
                self._backoff = _DISCOVERY_BACKOFF_S[0]
                return reply
        return self._grpc.handle(request)

    def _bulk_for(self, request: Request) -> BulkTransport | None:
        with self._lock:
            if self._bulk is not None or self._clock() < self._ask_at:
                return self._bulk
            self._ask_at = self._clock() + self._backoff  # one discovery at a time
        found = self._discover(request.deadline)
        if found is None:
            return None
        with self._lock:
            self._bulk = self._bulk or BulkTransport(
                HostPort(HostPort.parse(self.address).host, found.bulk_port),
                token=self._token,
                address=self.address,
                max_message_bytes=self._max_message_bytes,
                takes_put=found.bulk_put,
                takes_lookup=found.bulk_lookup,
            )
            return self._bulk

    def _discover(self, deadline: float) -> pb.StatsReply | None:
        """The vault's Stats when it offers a bulk port (they say its port and which operations it takes
        there); None (no bulk port, or no answer)."""
        try:
            raw = self._grpc.handle(Request(STATS, b"", deadline))
            reply = parse_reply(pb.StatsReply, raw, self.address)
            return reply if reply.bulk_port else None
        except (VaultError, ValueError) as exc:
            log.debug("no bulk port for %s: %s", self.address, exc)
            return None

    def _forget(self, channel: BulkTransport) -> None:
        with self._lock:
            if self._bulk is channel:
                self._bulk = None
            self._ask_at = self._clock() + self._backoff
            self._backoff = min(2 * self._backoff, _DISCOVERY_BACKOFF_S[1])
        channel.close()

    def close(self) -> None:
        with self._lock:
            channel, self._bulk = self._bulk, None
        if channel is not None:
            channel.close()
        self._grpc.close()


_BULK_METHODS = (BATCH_GET, PUT, PREFIX_LOOKUP)


def _carries(channel: BulkTransport, method: str) -> bool:
    """Whether ``method`` goes over this bulk port (BatchGet always; the others where the vault says so)."""
    if method == PUT:
        return channel.takes_put
    if method == PREFIX_LOOKUP:
        return channel.takes_lookup
    return method == BATCH_GET


def _refused(address: str, details: str, code: str = "UNAVAILABLE") -> BulkRefused:
    """``code`` is the refusing ERROR record's status; UNAVAILABLE when the connection itself failed."""
    return BulkRefused(f"UNAVAILABLE: bulk port refused: {details}", address=address, code=code)


def _answered(request: Request, exc: BulkRefused) -> bool:
    """Whether a refusal is the vault's answer to this Put (RESOURCE_EXHAUSTED: over its limits, its
    in-flight budget or a full store), not a sign that the bulk port is gone: sending the same bytes again
    on a fresh connection would not help, and BatchGet should keep using the port."""
    return request.method == PUT and exc.code != "UNAVAILABLE"


def _set_deadline(conn: socket.socket, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    conn.settimeout(remaining)
