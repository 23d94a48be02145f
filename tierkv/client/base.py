"""What the sync and asyncio clients share: options, the operations, and the choice of transport."""

from __future__ import annotations

from typing import Any

from tierkv.client._rpc import ClientOptions
from tierkv.client.bulk import BulkFirst
from tierkv.client.calls import Calls
from tierkv.client.transport import AsyncGrpcTransport, AsyncTransport, GrpcTransport, Transport
from tierkv.config import TLSConfig


def open_transport(address: str, options: ClientOptions) -> Transport:
    """The sync client's transport, chosen here and nowhere else: BatchGet over the vault's bulk port
    (when it has one and neither TLS nor ``bulk=False`` rules it out), everything else over gRPC."""
    grpc = GrpcTransport(address, options)
    if not options.bulk or options.tls_enabled:
        return grpc
    return BulkFirst(grpc, address, options)


def open_async_transport(address: str, options: ClientOptions) -> AsyncTransport:
    """The asyncio client's transport: gRPC for every method (the bulk port has no asyncio transport)."""
    return AsyncGrpcTransport(address, options)


class ClientBase:
    """One vault's address, options and operations. Keyword options: ``timeout``, ``token``, ``tls`` and
    the fields of :class:`~tierkv.client._rpc.ClientOptions` (frame and batch sizes, message limit,
    ``bulk``)."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 2.0,
        token: str | None = None,
        tls: TLSConfig | None = None,
        **options: Any,
    ) -> None:
        self.address = address
        self.options = ClientOptions(timeout=timeout, token=token, tls=tls, **options)
        self.calls = Calls(address, self.options)

    @property
    def timeout(self) -> float:
        return self.options.timeout

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r}, timeout={self.timeout})"
