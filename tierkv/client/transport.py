"""How a vault call travels: transports behind one seam.

Operations (:mod:`tierkv.client.calls`) build a :class:`Request` and parse its reply without doing I/O;
a transport moves the request's messages to the vault and hands back what came back. As with httpx's
``BaseTransport``, a client holds one transport and never asks how it works:

- :class:`GrpcTransport` / :class:`AsyncGrpcTransport`: every method over one gRPC channel;
- :class:`tierkv.client.bulk.BulkTransport`: BatchGet over the vault's bulk port (tierkv-bulk/1);
- :class:`tierkv.client.bulk.BulkFirst`: BatchGet over the bulk port while the vault offers one, the rest
  over gRPC — :func:`tierkv.client.base.open_transport` is the one place that picks.

A transport raises only :class:`~tierkv.errors.VaultError`.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc

from tierkv._malloc import tune_malloc
from tierkv.client._rpc import ClientOptions, error_for, map_error
from tierkv.wire import SERVICE
from tierkv.wire.framing import Buffer

PUT = f"/{SERVICE}/Put"
BATCH_GET = f"/{SERVICE}/BatchGet"
PREFIX_LOOKUP = f"/{SERVICE}/PrefixLookup"
DELETE = f"/{SERVICE}/Delete"
STATS = f"/{SERVICE}/Stats"
FLUSH = f"/{SERVICE}/Flush"
LIST_NAMESPACES = f"/{SERVICE}/ListNamespaces"
INSPECT = f"/{SERVICE}/Inspect"
SUCCESSORS = f"/{SERVICE}/Successors"
HOTTEST = f"/{SERVICE}/Hottest"
HEALTH = "/grpc.health.v1.Health/Check"

_CLIENT_STREAMING = {PUT}
_SERVER_STREAMING = {BATCH_GET}


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One call: the method's full gRPC path, its request (one serialized message, or for a
    client-streaming method the messages in order) and the monotonic time by which it must be answered.

    A server-streaming method's reply messages go to ``sink`` one by one as they arrive (so blobs are
    assembled while the rest is in flight); the transport then returns ``b""``.
    """

    method: str
    body: bytes | Iterable[bytes]
    deadline: float
    sink: Callable[[Buffer], None] | None = None

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


class Transport(abc.ABC):
    @abc.abstractmethod
    def handle(self, request: Request) -> bytes:
        """Carry out ``request``; its reply message (``b""`` when the reply went to ``request.sink``)."""

    @abc.abstractmethod
    def close(self) -> None: ...


class AsyncTransport(abc.ABC):
    @abc.abstractmethod
    async def handle(self, request: Request) -> bytes:
        """As :meth:`Transport.handle`, awaitable."""

    @abc.abstractmethod
    async def close(self) -> None: ...


class _Channel:
    """One gRPC channel (sync or asyncio: both expose the same factories) and its methods, bound on first
    use with identity serializers, since every message is built and parsed by the operations."""

    def __init__(self, address: str, options: ClientOptions, *, aio: bool) -> None:
        tune_malloc()
        self.address = address
        self.metadata = options.metadata()
        creds = options.credentials()
        opts = options.channel_options()
        module: Any = grpc.aio if aio else grpc
        self.channel = (
            module.secure_channel(address, creds, options=opts)
            if creds
            else module.insecure_channel(address, options=opts)
        )
        self._stubs: dict[str, Any] = {}

    def stub(self, method: str) -> Any:
        stub = self._stubs.get(method)
        if stub is None:
            if method in _CLIENT_STREAMING:
                factory = self.channel.stream_unary
            elif method in _SERVER_STREAMING:
                factory = self.channel.unary_stream
            else:
                factory = self.channel.unary_unary
            stub = self._stubs[method] = factory(method, _identity, _identity)
        return stub


class GrpcTransport(Transport):
    """Every vault method over one gRPC channel."""

    def __init__(self, address: str, options: ClientOptions) -> None:
        self._grpc = _Channel(address, options, aio=False)

    def handle(self, request: Request) -> bytes:
        g = self._grpc
        try:
            body, timeout = _message(request.body), request.remaining()
            if not isinstance(body, bytes):
                return self._stream(request.method, body, timeout)
            reply = g.stub(request.method)(body, timeout=timeout, metadata=g.metadata)
            if request.sink is None:
                return bytes(reply)
            try:
                for message in reply:
                    request.sink(message)
            finally:
                reply.cancel()  # a reply the sink refused is not read on; a finished call ignores this
            return b""
        except grpc.RpcError as exc:
            raise map_error(exc, g.address) from None

    def _stream(self, method: str, body: Iterator[bytes], timeout: float) -> bytes:
        """A client-streaming call (Put), through gRPC's future: its blocking call waits until its
        request iterator's writes are taken, and a vault that stops reading (stalled, its flow-control
        window full) never takes them, so the call outlived its deadline for as long as the vault stayed
        stopped. The future ends at the deadline; a wait a little past it is the backstop."""
        g = self._grpc
        call = g.stub(method).future(body, timeout=timeout, metadata=g.metadata)
        try:
            return bytes(call.result(timeout=timeout + STREAM_GRACE_S))
        except grpc.FutureTimeoutError:
            call.cancel()
            raise error_for("DEADLINE_EXCEEDED", "Deadline Exceeded", g.address) from None

    def close(self) -> None:
        self._grpc.channel.close()


STREAM_GRACE_S = 1.0
"""How long past its deadline a client-streaming call is waited for before it is cancelled here."""


class AsyncGrpcTransport(AsyncTransport):
    """Every vault method over one ``grpc.aio`` channel."""

    def __init__(self, address: str, options: ClientOptions) -> None:
        self._grpc = _Channel(address, options, aio=True)

    async def handle(self, request: Request) -> bytes:
        g = self._grpc
        body, timeout = _message(request.body), request.remaining()
        call = g.stub(request.method)(body, timeout=timeout, metadata=g.metadata)
        try:
            if request.sink is None:
                return bytes(await call)
            async for message in call:
                request.sink(message)
            return b""
        except grpc.RpcError as exc:
            raise map_error(exc, g.address) from None
        finally:
            if request.sink is not None:
                call.cancel()

    async def close(self) -> None:
        await self._grpc.channel.close(None)


def _identity(value: Any) -> Any:
    return value


def _message(body: bytes | Iterable[bytes]) -> bytes | Iterator[bytes]:
    """A request as gRPC takes it: one message, or an iterator over a client stream's messages (a body
    may be an iterable that can be iterated again, such as a Put's frames)."""
    return body if isinstance(body, bytes) else iter(body)


__all__ = [
    "BATCH_GET",
    "DELETE",
    "FLUSH",
    "HEALTH",
    "HOTTEST",
    "INSPECT",
    "LIST_NAMESPACES",
    "PREFIX_LOOKUP",
    "PUT",
    "STATS",
    "SUCCESSORS",
    "AsyncGrpcTransport",
    "AsyncTransport",
    "GrpcTransport",
    "Request",
    "Transport",
]
