"""Every vault operation written once, without I/O, for the sync and the asyncio client alike.

An operation is a generator: it yields each :class:`~tierkv.client.transport.Request` it needs, receives
the reply (or has the transport's :class:`~tierkv.errors.VaultError` thrown in) and returns its result.
:class:`Exchange` steps one through; a client only adds the transport call, with or without ``await``::

    exchange = Exchange(calls.prefix_lookup(namespace, keys))
    while exchange.request is not None:
        exchange.answer(transport.handle(exchange.request))      # await transport.handle(...) in asyncio
    return exchange.result
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from functools import partial
from typing import Generic, TypeVar

from grpc_health.v1 import health_pb2

from tierkv.client._rpc import (
    BlobSink,
    ClientOptions,
    GetAssembler,
    Items,
    Metas,
    batch_bytes,
    chain_from_reply,
    entry_from_reply,
    keys_request,
    lookup_request,
    namespace_from_reply,
    parse_reply,
    put_batches,
    put_frames,
    refused,
    stats_from_reply,
)
from tierkv.client.transport import (
    BATCH_GET,
    DELETE,
    FLUSH,
    HEALTH,
    HOTTEST,
    INSPECT,
    LIST_NAMESPACES,
    PREFIX_LOOKUP,
    PUT,
    STATS,
    SUCCESSORS,
    Request,
)
from tierkv.client.types import EntryInfo, NamespaceInfo, PutAck, VaultStats
from tierkv.errors import VaultError
from tierkv.records import REFUSED, HotChain, Successor
from tierkv.wire import pb
from tierkv.wire.framing import Buffer
from tierkv.wire.records import from_message

log = logging.getLogger(__name__)

T = TypeVar("T")
Op = Generator[Request, bytes, T]
"""An operation: yields requests, is sent their replies, returns its result."""


class Calls:
    """The operations of one vault (its address names it in errors) under one set of options."""

    def __init__(self, address: str, options: ClientOptions) -> None:
        self.address = address
        self.options = options

    def put(self, namespace: bytes, items: Items, priority: int, meta: Metas | None = None) -> Op[int]:
        """Store blobs (see :meth:`put_acks`); returns how many the vault said it stored."""
        ack = yield from self.put_acks(namespace, items, priority, meta)
        if ack.rejected:
            log.warning("vault %s refused %d blobs (%s)", self.address, len(ack.rejected), REFUSED)
        return len(ack.stored)

    def put_acks(
        self, namespace: bytes, items: Items, priority: int, meta: Metas | None = None
    ) -> Op[PutAck]:
        """Store blobs in batches of at most ``max_batch_bytes``; which ones the vault stored and which it
        refused, by position. The vault writes a batch in one or more write transactions (more when it
        is larger than a sixteenth of the vault's budget), so a put cut short may leave part of a batch
        stored; only what a reply acknowledged counts."""
        stored: list[int] = []
        rejected: list[int] = []
        for batch in put_batches(items, self.options, priority, meta):
            deadline = self.options.put_deadline(batch_bytes(batch))
            raw = yield Request(PUT, put_frames(namespace, batch, self.options), deadline)
            refusals = refused(parse_reply(pb.PutReply, raw, self.address), len(batch), self.address)
            for j, blob in enumerate(batch):
                (rejected if j in refusals else stored).append(blob.index)
        return PutAck(tuple(stored), tuple(rejected))

    def get_buffers(
        self, namespace: bytes, keys: Sequence[bytes], timeout: float | None
    ) -> Op[list[Buffer | None]]:
        """One BatchGet; the reply's frames are assembled as they arrive."""
        if not keys:
            return []
        assembler = GetAssembler(len(keys), self.address)
        yield self._batch_get(namespace, keys, timeout, assembler)
        return assembler.finish()

    def get_each(
        self, namespace: bytes, keys: Sequence[bytes], timeout: float | None, on_blob: BlobSink
    ) -> Op[list[int | None]]:
        """One BatchGet whose blobs go to ``on_blob`` as they arrive; the size of each found one."""
        if not keys:
            return []
        assembler = GetAssembler(len(keys), self.address, on_blob)
        yield self._batch_get(namespace, keys, timeout, assembler)
        assembler.finish()
        return assembler.sizes

    def _batch_get(
        self, namespace: bytes, keys: Sequence[bytes], timeout: float | None, assembler: GetAssembler
    ) -> Request:
        request = keys_request(pb.BatchGetRequest, namespace, keys)
        return Request(BATCH_GET, request, self.options.deadline(timeout), sink=assembler)

    def prefix_lookup(
        self, namespace: bytes, keys: Sequence[bytes], timeout: float | None, lease_ms: int = 0
    ) -> Op[int]:
        """``lease_ms``: the vault keeps the entries it reports this long (capped by the vault) or until
        this tenant reads them."""
        request = lookup_request(namespace, keys, lease_ms)
        raw = yield Request(PREFIX_LOOKUP, request, self.options.deadline(timeout))
        return parse_reply(pb.PrefixLookupReply, raw, self.address).count

    def delete(
        self, namespace: bytes, keys: Sequence[bytes], timeout: float | None, tenant: str = ""
    ) -> Op[int]:
        """Delete keys (of ``tenant``'s namespaces: the vault lets only an admin name another tenant)."""
        request = pb.DeleteRequest(namespace=namespace, keys=list(keys), tenant=tenant)
        raw = yield Request(DELETE, request.SerializeToString(), self.options.deadline(timeout))
        return parse_reply(pb.DeleteReply, raw, self.address).deleted

    def flush(self, namespace: bytes, all_namespaces: bool, tenant: str = "") -> Op[int]:
        """Empty one namespace, or every one when asked in so many words (an empty namespace is not
        "all": that request is refused here, before it is sent). ``tenant`` (admin only) acts in that
        tenant's namespaces; all namespaces without a tenant means every tenant's."""
        if bool(namespace) == all_namespaces:
            raise ValueError("flush takes a namespace, or all_namespaces=True with no namespace")
        request = pb.FlushRequest(namespace=namespace, all_namespaces=all_namespaces, tenant=tenant)
        raw = yield Request(FLUSH, request.SerializeToString(), self.options.deadline())
        return parse_reply(pb.FlushReply, raw, self.address).deleted

    def list_namespaces(
        self, tenant: str, limit: int, timeout: float | None
    ) -> Op[tuple[list[NamespaceInfo], bool]]:
        """The caller's namespaces (an admin's: every tenant's, or ``tenant``'s), and whether the vault
        had more than it listed."""
        request = pb.ListNamespacesRequest(tenant=tenant, limit=limit).SerializeToString()
        raw = yield Request(LIST_NAMESPACES, request, self.options.deadline(timeout))
        reply = parse_reply(pb.ListNamespacesReply, raw, self.address)
        return [namespace_from_reply(n) for n in reply.namespaces], reply.truncated

    def inspect(self, namespace: bytes, key: bytes, tenant: str, timeout: float | None) -> Op[EntryInfo]:
        request = pb.InspectRequest(namespace=namespace, key=key, tenant=tenant).SerializeToString()
        raw = yield Request(INSPECT, request, self.options.deadline(timeout))
        return entry_from_reply(parse_reply(pb.InspectReply, raw, self.address), self.address)

    def hottest(self, namespace: bytes, limit: int, tenant: str, timeout: float | None) -> Op[list[HotChain]]:
        """The namespace's most-hit chains, hottest first (``limit`` 0: the vault's default)."""
        request = pb.HottestRequest(namespace=namespace, limit=limit, tenant=tenant).SerializeToString()
        raw = yield Request(HOTTEST, request, self.options.deadline(timeout))
        reply = parse_reply(pb.HottestReply, raw, self.address)
        if reply.truncated:
            log.info(
                "Hottest on %s: %d chains, truncated at the vault's bounds", self.address, len(reply.chains)
            )
        return [chain_from_reply(c, self.address) for c in reply.chains]

    def successors(
        self, namespace: bytes, keys: Sequence[bytes], max_bytes: int, max_keys: int, timeout: float | None
    ) -> Op[list[Successor]]:
        """The blocks the vault expects to be fetched after the chain ``keys``, best first."""
        request = pb.SuccessorsRequest(
            namespace=namespace, keys=list(keys), max_bytes=max_bytes, max_keys=max_keys
        ).SerializeToString()
        raw = yield Request(SUCCESSORS, request, self.options.deadline(timeout))
        reply = parse_reply(pb.SuccessorsReply, raw, self.address)
        return [from_message(s, Successor) for s in reply.successors]

    def stats(self) -> Op[VaultStats]:
        raw = yield Request(STATS, b"", self.options.deadline())
        return stats_from_reply(parse_reply(pb.StatsReply, raw, self.address))

    def health(self, service: str) -> Op[bool]:
        """grpc.health.v1 Check: True when SERVING; any failure, answer or not, is False."""
        request = health_pb2.HealthCheckRequest(service=service).SerializeToString()
        try:
            raw = yield Request(HEALTH, request, self.options.deadline())
            reply = parse_reply(health_pb2.HealthCheckResponse, raw, self.address)
        except VaultError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


class Exchange(Generic[T]):
    """Steps one operation: :attr:`request` is what it asks for next (None once it is done, with
    :attr:`result` set); :meth:`answer` gives it the reply, or the transport's error to raise inside."""

    def __init__(self, op: Op[T]) -> None:
        self._op = op
        self.request: Request | None = None
        self.result: T
        self._step(partial(next, op))

    def answer(self, outcome: bytes | VaultError) -> None:
        if isinstance(outcome, VaultError):
            self._step(partial(self._op.throw, outcome))
        else:
            self._step(partial(self._op.send, outcome))

    def _step(self, advance: Callable[[], Request]) -> None:
        try:
            self.request = advance()
        except StopIteration as done:
            self.request = None
            self.result = done.value


__all__ = ["Calls", "Exchange", "Op"]
