"""The synchronous client of one vault.

Every call has a deadline; every failure is a :class:`~tierkv.errors.VaultError` (unreachable, slow or
draining vaults raise :class:`~tierkv.errors.VaultUnavailable`). Engines should not call this directly on
the serving path: :class:`tierkv.client.cluster.Cluster` turns failures into misses.

>>> with VaultClient("127.0.0.1:50051", timeout=2.0) as c:      # doctest: +SKIP
...     c.put(b"ns", {b"key": b"blob"})
...     c.get(b"ns", [b"key", b"other"])                        # [b"blob", None]
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from tierkv.client import _rpc
from tierkv.client._rpc import Items
from tierkv.client.bulk import BulkChannel
from tierkv.client.types import VaultStats
from tierkv.errors import VaultError, VaultUnavailable
from tierkv.wire import pb
from tierkv.wire.framing import Buffer

log = logging.getLogger(__name__)

_BULK_RETRY_S = 30.0


class VaultClient(_rpc.ClientBase):
    """One vault over one gRPC channel (plus its bulk port for BatchGet). Thread-safe; use as a context
    manager or call :meth:`close`. Keyword options: ``timeout``, ``token``, ``tls`` and the fields of
    :class:`~tierkv.client._rpc.ClientOptions` (frame and batch sizes, message limit, ``bulk``)."""

    def __init__(self, address: str, **options: Any) -> None:
        super().__init__(address, **options)
        self._bulk: BulkChannel | None = None
        self._bulk_retry_at = 0.0
        self._bulk_lock = threading.Lock()

    # -- data --------------------------------------------------------------------------------------

    def put(self, namespace: bytes, items: Items, *, priority: int = 0) -> int:
        """Store blobs; returns how many the vault acknowledged (one write transaction per batch)."""
        stored = 0
        for batch in _rpc.put_batches(items, self.options, priority):
            frames = _rpc.put_frames(namespace, batch, self.options)
            deadline = self.options.put_deadline(_rpc.batch_bytes(batch))
            try:
                reply = pb.PutReply.FromString(
                    self._put(frames, timeout=deadline, metadata=self.options.metadata())
                )
            except grpc.RpcError as exc:
                raise _rpc.map_error(exc, self.address) from None
            stored += reply.stored
            if reply.rejected:
                log.warning("vault %s rejected %d blobs larger than its budget", self.address, reply.rejected)
        return stored

    def get_buffers(self, namespace: bytes, keys: Sequence[bytes]) -> list[Buffer | None]:
        """Like :meth:`get` without the final copy: memoryviews into the received frames."""
        if not keys:
            return []
        request = _rpc.keys_request(pb.BatchGetRequest, namespace, keys)
        channel = self._bulk_channel()
        if channel is not None:
            assembler = _rpc.GetAssembler(len(keys))
            try:
                channel.batch_get(request, assembler, timeout=self.timeout)
                return assembler.finish(self.address)
            except VaultUnavailable as exc:
                if exc.code != "CONNECT":
                    raise
                log.info("bulk port of %s unreachable, using gRPC: %s", self.address, exc)
                self._drop_bulk()
        assembler = _rpc.GetAssembler(len(keys))
        try:
            for frame in self._get(request, timeout=self.timeout, metadata=self.options.metadata()):
                assembler.feed(frame, self.address)
        except grpc.RpcError as exc:
            raise _rpc.map_error(exc, self.address) from None
        return assembler.finish(self.address)

    def get(self, namespace: bytes, keys: Sequence[bytes]) -> list[bytes | None]:
        """One BatchGet: a blob per key, None where missing or corrupt (the vault verified checksums)."""
        return _rpc.as_bytes(self.get_buffers(namespace, keys))

    def prefix_lookup(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        """How many leading keys of a chain the vault holds."""
        raw = self._call("PrefixLookup", _rpc.keys_request(pb.PrefixLookupRequest, namespace, keys))
        return pb.PrefixLookupReply.FromString(raw).count

    def delete(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        raw = self._call("Delete", _rpc.keys_request(pb.DeleteRequest, namespace, keys))
        return pb.DeleteReply.FromString(raw).deleted

    def flush(self, namespace: bytes = b"") -> int:
        """Delete a namespace (everything when empty); returns entries deleted."""
        raw = self._call("Flush", pb.FlushRequest(namespace=namespace).SerializeToString())
        return pb.FlushReply.FromString(raw).deleted

    def stats(self) -> VaultStats:
        return _rpc.stats_from_reply(self._call("Stats", b""))

    def health(self, service: str = "") -> bool:
        """Standard grpc.health.v1 check: True when SERVING, False otherwise (never raises)."""
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout)
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def _bulk_channel(self) -> BulkChannel | None:
        """The vault's bulk data plane, asked for once (and again after a failure, at most every 30 s)."""
        if not self.options.bulk or (self.options.tls is not None and self.options.tls.enabled):
            return None
        with self._bulk_lock:
            if self._bulk is not None or time.monotonic() < self._bulk_retry_at:
                return self._bulk
            self._bulk_retry_at = time.monotonic() + _BULK_RETRY_S
        try:
            port = self.stats().bulk_port
        except VaultError:
            return None
        if not port:
            return None
        host = self.address.rpartition(":")[0]
        channel = BulkChannel(host, port, token=self.options.token, address=self.address)
        with self._bulk_lock:
            self._bulk = self._bulk or channel
            return self._bulk

    def _drop_bulk(self) -> None:
        with self._bulk_lock:
            channel, self._bulk = self._bulk, None
            self._bulk_retry_at = time.monotonic() + _BULK_RETRY_S
        if channel is not None:
            channel.close()

    def _call(self, name: str, request: bytes) -> bytes:
        try:
            result: bytes = self._unary[name](request, timeout=self.timeout, metadata=self.options.metadata())
        except grpc.RpcError as exc:
            raise _rpc.map_error(exc, self.address) from None
        return result

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        self._drop_bulk()
        self._channel.close()

    def __enter__(self) -> VaultClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["VaultClient", "VaultError"]
