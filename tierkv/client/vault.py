"""The synchronous client of one vault.

Every call has a deadline; every failure is a :class:`~tierkv.errors.VaultError` (unreachable, slow or
draining vaults raise :class:`~tierkv.errors.VaultUnavailable`). Engines should not call this directly on
the serving path: :class:`tierkv.client.cluster.Cluster` turns failures into misses.

>>> with VaultClient("127.0.0.1:50051", timeout=2.0) as c:      # doctest: +SKIP
...     c.put(b"ns", {b"key": b"blob"})
...     c.get(b"ns", [b"key", b"other"])                        # [b"blob", None]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from tierkv.client._rpc import BlobSink, Items, Metas, as_bytes
from tierkv.client.base import ClientBase, open_transport
from tierkv.client.bulk import BulkFirst
from tierkv.client.calls import Exchange, Op
from tierkv.client.transport import Request, Transport
from tierkv.client.types import EntryInfo, NamespaceInfo, PutAck, VaultStats
from tierkv.errors import VaultError
from tierkv.records import HotChain, Successor
from tierkv.wire.framing import Buffer

T = TypeVar("T")


class VaultClient(ClientBase):
    """One vault over one gRPC channel, plus its bulk port for BatchGet (see
    :func:`~tierkv.client.base.open_transport`). Thread-safe; use as a context manager or call
    :meth:`close`. ``timeout`` (seconds) is every call's deadline unless a call names its own."""

    def __init__(self, address: str, *, transport: Transport | None = None, **options: Any) -> None:
        """``transport`` replaces the one :func:`~tierkv.client.base.open_transport` would choose (a
        :class:`~tierkv.client.mock.MockTransport` in tests)."""
        super().__init__(address, **options)
        self.transport = transport or open_transport(address, self.options)

    # -- data --------------------------------------------------------------------------------------

    def put(self, namespace: bytes, items: Items, *, priority: int = 0, meta: Metas | None = None) -> int:
        """Store blobs; returns how many the vault's replies said it stored (refusals are logged).
        ``meta`` gives keys their retention metadata (docs/concepts/retention.md); keys it lacks are untagged.

        Not atomic: the client sends batches of at most ``max_batch_bytes`` and the vault writes each in
        write transactions of at most a sixteenth of its budget, so a put cut short (a killed client or
        vault) may leave some of its blobs stored; each transaction commits whole."""
        return self._run(self.calls.put(namespace, items, priority, meta))

    def put_acks(
        self, namespace: bytes, items: Items, *, priority: int = 0, meta: Metas | None = None
    ) -> PutAck:
        """:meth:`put`, answered by position: which of ``items`` the vault stored and which it refused."""
        return self._run(self.calls.put_acks(namespace, items, priority, meta))

    def get_buffers(
        self, namespace: bytes, keys: Sequence[bytes], *, timeout: float | None = None
    ) -> list[Buffer | None]:
        """Like :meth:`get` without the final copy: memoryviews into the received frames."""
        return self._run(self.calls.get_buffers(namespace, keys, timeout))

    def get_each(
        self, namespace: bytes, keys: Sequence[bytes], on_blob: BlobSink, *, timeout: float | None = None
    ) -> list[int | None]:
        """One BatchGet that hands each found blob to ``on_blob(i, blob)`` as it arrives (on this thread)
        and keeps nothing, so the caller can use a blob while the rest is still on the wire and the
        receive buffers are reused; returns each key's blob size (None: not found). A blob is valid only
        during its ``on_blob`` call."""
        return self._run(self.calls.get_each(namespace, keys, timeout, on_blob))

    def get(
        self, namespace: bytes, keys: Sequence[bytes], *, timeout: float | None = None
    ) -> list[bytes | None]:
        """One BatchGet: a blob per key, None where missing or corrupt (the vault verified checksums)."""
        return as_bytes(self.get_buffers(namespace, keys, timeout=timeout))

    def prefix_lookup(
        self, namespace: bytes, keys: Sequence[bytes], *, timeout: float | None = None, lease_ms: int = 0
    ) -> int:
        """How many leading keys of a chain the vault holds; with ``lease_ms`` it keeps them that long
        (docs/concepts/leases.md)."""
        return self._run(self.calls.prefix_lookup(namespace, keys, timeout, lease_ms))

    def delete(
        self, namespace: bytes, keys: Sequence[bytes], *, tenant: str = "", timeout: float | None = None
    ) -> int:
        """Delete keys; returns how many existed. ``tenant`` (admin only) acts in that tenant's
        namespaces instead of the caller's."""
        return self._run(self.calls.delete(namespace, keys, timeout, tenant))

    def flush(self, namespace: bytes = b"", *, all_namespaces: bool = False, tenant: str = "") -> int:
        """Delete one namespace, or every namespace with ``all_namespaces=True`` (the vault allows that to
        its admin role only); returns entries deleted. ``flush(b"")`` alone is a ValueError. ``tenant``
        (admin only) acts in that tenant's namespaces; ``all_namespaces`` without it empties every
        tenant."""
        return self._run(self.calls.flush(namespace, all_namespaces, tenant))

    # -- administration ----------------------------------------------------------------------------

    def list_namespaces(
        self, *, tenant: str = "", limit: int = 0, timeout: float | None = None
    ) -> tuple[list[NamespaceInfo], bool]:
        """Namespaces with their keys and bytes: the caller's tenant's; an admin's, every tenant's (or
        ``tenant``'s). The bool says the vault had more than ``limit`` (0: the vault's cap, 10,000)."""
        return self._run(self.calls.list_namespaces(tenant, limit, timeout))

    def inspect(
        self, namespace: bytes, key: bytes, *, tenant: str = "", timeout: float | None = None
    ) -> EntryInfo:
        """One entry's size, blob head and retention record, without counting as a read."""
        return self._run(self.calls.inspect(namespace, key, tenant, timeout))

    def hottest(
        self, namespace: bytes, *, limit: int = 0, tenant: str = "", timeout: float | None = None
    ) -> list[HotChain]:
        """The namespace's most-hit chains with their token ids, hottest first (``limit`` 0: the vault's
        default, 32); ``tenant`` (admin only) asks about that tenant's namespace. Not a read."""
        return self._run(self.calls.hottest(namespace, limit, tenant, timeout))

    def successors(
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
        return self._run(self.calls.successors(namespace, keys, max_bytes, max_keys, timeout))

    def stats(self) -> VaultStats:
        return self._run(self.calls.stats())

    def health(self, service: str = "") -> bool:
        """Standard grpc.health.v1 check: True when SERVING, False otherwise (never raises)."""
        return self._run(self.calls.health(service))

    @property
    def bulk_port(self) -> int | None:
        """The bulk port BatchGet uses now; None while it goes over gRPC."""
        bulk = self.transport.bulk if isinstance(self.transport, BulkFirst) else None
        return None if bulk is None else bulk.endpoint.port

    def _run(self, op: Op[T]) -> T:
        exchange = Exchange(op)
        while exchange.request is not None:
            exchange.answer(self._send(exchange.request))
        return exchange.result

    def _send(self, request: Request) -> bytes | VaultError:
        try:
            return self.transport.handle(request)
        except VaultError as exc:
            return exc

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> VaultClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["VaultClient", "VaultError"]
