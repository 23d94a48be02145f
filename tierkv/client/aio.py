"""The asyncio twin of :class:`tierkv.client.vault.VaultClient`: same methods, awaitable.

Request building and reply assembly are shared (``tierkv.client._rpc``); only the transport differs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

import grpc
from grpc_health.v1 import health_pb2

from tierkv.client import _rpc
from tierkv.client._rpc import ClientOptions, Items
from tierkv.client.types import VaultStats
from tierkv.wire import Blob, pb
from tierkv.wire.framing import Buffer

log = logging.getLogger(__name__)


class AsyncVaultClient(_rpc.ClientBase):
    """One vault over one ``grpc.aio`` channel (BatchGet included: the bulk port is the sync client's).
    Create and use it inside a running event loop; same options as :class:`~tierkv.client.VaultClient`."""

    aio = True

    async def put(self, namespace: bytes, items: Items, *, priority: int = 0) -> int:
        stored = 0
        for batch in _rpc.put_batches(items, self.options, priority):
            deadline = self.options.put_deadline(_rpc.batch_bytes(batch))
            try:
                raw = await self._put(
                    _frames(namespace, batch, self.options),
                    timeout=deadline,
                    metadata=self.options.metadata(),
                )
            except grpc.RpcError as exc:
                raise _rpc.map_error(exc, self.address) from None
            reply = pb.PutReply.FromString(raw)
            stored += reply.stored
            if reply.rejected:
                log.warning("vault %s rejected %d blobs larger than its budget", self.address, reply.rejected)
        return stored

    async def get_buffers(self, namespace: bytes, keys: Sequence[bytes]) -> list[Buffer | None]:
        if not keys:
            return []
        assembler = _rpc.GetAssembler(len(keys))
        request = _rpc.keys_request(pb.BatchGetRequest, namespace, keys)
        try:
            async for frame in self._get(request, timeout=self.timeout, metadata=self.options.metadata()):
                assembler.feed(frame, self.address)
        except grpc.RpcError as exc:
            raise _rpc.map_error(exc, self.address) from None
        return assembler.finish(self.address)

    async def get(self, namespace: bytes, keys: Sequence[bytes]) -> list[bytes | None]:
        return _rpc.as_bytes(await self.get_buffers(namespace, keys))

    async def prefix_lookup(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        raw = await self._call("PrefixLookup", _rpc.keys_request(pb.PrefixLookupRequest, namespace, keys))
        return pb.PrefixLookupReply.FromString(raw).count

    async def delete(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        raw = await self._call("Delete", _rpc.keys_request(pb.DeleteRequest, namespace, keys))
        return pb.DeleteReply.FromString(raw).deleted

    async def flush(self, namespace: bytes = b"") -> int:
        raw = await self._call("Flush", pb.FlushRequest(namespace=namespace).SerializeToString())
        return pb.FlushReply.FromString(raw).deleted

    async def stats(self) -> VaultStats:
        return _rpc.stats_from_reply(await self._call("Stats", b""))

    async def health(self, service: str = "") -> bool:
        try:
            reply = await self._health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    async def _call(self, name: str, request: bytes) -> bytes:
        try:
            result: bytes = await self._unary[name](
                request, timeout=self.timeout, metadata=self.options.metadata()
            )
        except grpc.RpcError as exc:
            raise _rpc.map_error(exc, self.address) from None
        return result

    async def close(self) -> None:
        await self._channel.close(None)

    async def __aenter__(self) -> AsyncVaultClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _frames(namespace: bytes, batch: Sequence[Blob], options: ClientOptions) -> AsyncIterator[bytes]:
    for frame in _rpc.put_frames(namespace, batch, options):
        yield frame
