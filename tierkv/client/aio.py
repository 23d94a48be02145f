"""The asyncio client of one vault: :class:`tierkv.client.vault.VaultClient`'s methods, awaitable.

The operations are the same objects (:mod:`tierkv.client.calls`); only the transport is awaited.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from tierkv.client._rpc import Items, Metas, as_bytes
from tierkv.client.base import ClientBase, open_async_transport
from tierkv.client.calls import Exchange, Op
from tierkv.client.transport import Request
from tierkv.client.types import EntryInfo, NamespaceInfo, PutAck, VaultStats
from tierkv.errors import VaultError
from tierkv.records import HotChain, Successor
from tierkv.wire.framing import Buffer

T = TypeVar("T")


class AsyncVaultClient(ClientBase):
    """One vault over one ``grpc.aio`` channel (BatchGet included). Create and use it inside a running
    event loop; options and method semantics are :class:`~tierkv.client.VaultClient`'s."""

    def __init__(self, address: str, **options: Any) -> None:
        super().__init__(address, **options)
        self.transport = open_async_transport(address, self.options)

    async def put(
        self, namespace: bytes, items: Items, *, priority: int = 0, meta: Metas | None = None
    ) -> int:
        return await self._run(self.calls.put(namespace, items, priority, meta))

    async def put_acks(
        self, namespace: bytes, items: Items, *, priority: int = 0, meta: Metas | None = None
    ) -> PutAck:
        return await self._run(self.calls.put_acks(namespace, items, priority, meta))

    async def get_buffers(
        self, namespace: bytes, keys: Sequence[bytes], *, timeout: float | None = None
    ) -> list[Buffer | None]:
        return await self._run(self.calls.get_buffers(namespace, keys, timeout))

    async def get(
        self, namespace: bytes, keys: Sequence[bytes], *, timeout: float | None = None
    ) -> list[bytes | None]:
        return as_bytes(await self.get_buffers(namespace, keys, timeout=timeout))

    async def prefix_lookup(
        self, namespace: bytes, keys: Sequence[bytes], *, timeout: float | None = None, lease_ms: int = 0
    ) -> int:
        return await self._run(self.calls.prefix_lookup(namespace, keys, timeout, lease_ms))

    async def delete(
        self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = "", timeout: float | None = None
    ) -> int:
        return await self._run(self.calls.delete(namespace, keys, timeout, tenant))

    async def flush(self, namespace: bytes = b"", *, all_namespaces: bool = False, tenant: str = "") -> int:
        return await self._run(self.calls.flush(namespace, all_namespaces, tenant))

    async def list_namespaces(
        self, *, tenant: str = "", limit: int = 0, timeout: float | None = None
    ) -> tuple[list[NamespaceInfo], bool]:
        return await self._run(self.calls.list_namespaces(tenant, limit, timeout))

    async def inspect(
        self, namespace: bytes, key: bytes, *, tenant: str = "", timeout: float | None = None
    ) -> EntryInfo:
        return await self._run(self.calls.inspect(namespace, key, tenant, timeout))

    async def hottest(
        self, namespace: bytes, *, limit: int = 0, tenant: str = "", timeout: float | None = None
    ) -> list[HotChain]:
        return await self._run(self.calls.hottest(namespace, limit, tenant, timeout))

    async def successors(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        *,
        max_bytes: int = 0,
        max_keys: int = 0,
        timeout: float | None = None,
    ) -> list[Successor]:
        """The blocks the vault expects to be fetched after the chain ``keys`` (the caller's tenant's
        only), best first, within ``max_bytes`` and ``max_keys`` (0: the vault's defaults)."""
        return await self._run(self.calls.successors(namespace, keys, max_bytes, max_keys, timeout))

    async def stats(self) -> VaultStats:
        return await self._run(self.calls.stats())

    async def health(self, service: str = "") -> bool:
        return await self._run(self.calls.health(service))

    async def _run(self, op: Op[T]) -> T:
        exchange = Exchange(op)
        while exchange.request is not None:
            exchange.answer(await self._send(exchange.request))
        return exchange.result

    async def _send(self, request: Request) -> bytes | VaultError:
        try:
            return await self.transport.handle(request)
        except VaultError as exc:
            return exc

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> AsyncVaultClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
