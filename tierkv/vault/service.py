"""The ``tierkv.v1.Vault`` RPC handlers: parse, validate, call the store, answer.

All methods are registered with identity (de)serializers and parse their input here, so malformed bytes
become INVALID_ARGUMENT (a protobuf parse failure inside gRPC would surface as INTERNAL) and the daemon
keeps serving. Put and BatchGet carry blobs in hand-built frames (``tierkv.wire.framing``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from tierkv import __version__
from tierkv.vault.metrics import VaultMetrics
from tierkv.vault.store import Lookup, Store, StoreFullError
from tierkv.wire import SERVICE, Blob, FrameDecoder, FrameError, pb
from tierkv.wire.framing import (
    CORRUPT,
    FOUND,
    MAX_KEY_BYTES,
    MAX_NAMESPACE_BYTES,
    MISSING,
    Buffer,
    FrameLimitError,
    encode_frame_parts,
)

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
MAX_KEYS_PER_CALL = 1 << 20
_STATUS = {Lookup.FOUND: FOUND, Lookup.MISSING: MISSING, Lookup.CORRUPT: CORRUPT}


class Abort(Exception):
    """Ends a call with a gRPC status (the bulk channel sends the same code as an ERROR record)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


@dataclasses.dataclass(frozen=True)
class Limits:
    frame_bytes: int = 4 * 1024 * 1024
    max_item_bytes: int = 1024**3
    max_batch_bytes: int = 1024**3


class VaultService:
    """Handlers for one store. ``draining`` makes new calls fail fast with UNAVAILABLE during shutdown."""

    def __init__(self, store: Store, *, role: str, limits: Limits, metrics: VaultMetrics) -> None:
        self.store = store
        self.role = role
        self.limits = limits
        self.metrics = metrics
        self.started = time.monotonic()
        self.draining = threading.Event()
        self.bulk_port = 0
        self._bytes_in = 0
        self._bytes_out = 0
        self._io_lock = threading.Lock()

    # -- registration ------------------------------------------------------------------------------

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        ident: Callable[[Any], Any] = _identity
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Put": grpc.stream_unary_rpc_method_handler(self._wrap_put(), ident, ident),
                "BatchGet": grpc.unary_stream_rpc_method_handler(self._batch_get, ident, ident),
                "PrefixLookup": grpc.unary_unary_rpc_method_handler(
                    self._unary("PrefixLookup", pb.PrefixLookupRequest, self.prefix_lookup), ident, ident
                ),
                "Delete": grpc.unary_unary_rpc_method_handler(
                    self._unary("Delete", pb.DeleteRequest, self.delete), ident, ident
                ),
                "Stats": grpc.unary_unary_rpc_method_handler(
                    self._unary("Stats", pb.StatsRequest, self.stats), ident, ident
                ),
                "Flush": grpc.unary_unary_rpc_method_handler(
                    self._unary("Flush", pb.FlushRequest, self.flush), ident, ident
                ),
            },
        )

    def _unary(
        self, name: str, request_type: type[M], fn: Callable[[M], Message]
    ) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                self.check_serving()
                msg = parse_message(request_type, request)
                return fn(msg).SerializeToString()
            except Abort as exc:
                code = exc.code
                _abort(context, exc)
            finally:
                self.observe(name, code, start)

        return handle

    def _wrap_put(self) -> Callable[[Iterator[bytes], grpc.ServicerContext], bytes]:
        def handle(frames: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                self.check_serving()
                return self.put(frames).SerializeToString()
            except Abort as exc:
                code = exc.code
                _abort(context, exc)
            finally:
                self.observe("Put", code, start)

        return handle

    def _batch_get(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            self.check_serving()
            msg = parse_message(pb.BatchGetRequest, request)
            yield from self.batch_get(msg)
        except Abort as exc:
            code = exc.code
            _abort(context, exc)
        finally:
            self.observe("BatchGet", code, start)

    def observe(self, method: str, code: grpc.StatusCode, start: float) -> None:
        self.metrics.requests.labels(method, code.name).inc()
        self.metrics.latency.labels(method).observe(time.perf_counter() - start)

    def check_serving(self) -> None:
        if self.draining.is_set():
            raise Abort(grpc.StatusCode.UNAVAILABLE, "vault is shutting down")

    # -- methods -----------------------------------------------------------------------------------

    def put(self, frames: Iterable[bytes]) -> pb.PutReply:
        decoder = FrameDecoder(
            max_item_bytes=self.limits.max_item_bytes, max_total_bytes=self.limits.max_batch_bytes
        )
        items: list[tuple[bytes, bytes | bytearray | memoryview, int]] = []
        try:
            for frame in frames:
                for blob in decoder.feed(frame):
                    if blob.data is None:
                        raise FrameError("a Put segment must carry a blob")
                    items.append((blob.key, blob.data, blob.priority))
            decoder.close()
        except FrameError as exc:
            code = grpc.StatusCode.INVALID_ARGUMENT
            if isinstance(exc, FrameLimitError):
                code = grpc.StatusCode.RESOURCE_EXHAUSTED
            raise Abort(code, str(exc)) from exc
        if not items:
            return pb.PutReply()
        try:
            outcome = self.store.put_many(decoder.namespace or b"", items)
        except StoreFullError as exc:
            raise Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
        nbytes = decoder.total_bytes
        self._count_io(bytes_in=nbytes)
        self.metrics.batch_bytes.labels("Put").observe(nbytes)
        return pb.PutReply(
            stored=outcome.stored,
            rejected=len(outcome.rejected),
            evicted=outcome.evicted,
            rejected_index=outcome.rejected,
        )

    def batch_get(self, request: pb.BatchGetRequest) -> Iterator[bytes]:
        for parts in self.batch_get_parts(request):
            yield b"".join(parts)

    def batch_get_parts(self, request: pb.BatchGetRequest) -> Iterator[list[Buffer]]:
        """The reply frames as gather lists pointing into LMDB's map: valid until the next item is asked
        for, so a caller copies or sends each one before moving on."""
        keys = _check_keys(request.namespace, request.keys)
        sent = 0
        with self.store.view_many(request.namespace, keys) as views:
            blobs = (
                Blob(key=key, data=view, index=i, status=_STATUS[status])
                for i, (key, (status, view)) in enumerate(zip(keys, views, strict=True))
            )
            for parts in encode_frame_parts(blobs, frame_bytes=self.limits.frame_bytes):
                sent += sum(len(p) for p in parts)
                yield parts
        self._count_io(bytes_out=sent)
        self.metrics.batch_bytes.labels("BatchGet").observe(sent)

    def prefix_lookup(self, request: pb.PrefixLookupRequest) -> pb.PrefixLookupReply:
        keys = _check_keys(request.namespace, request.keys)
        return pb.PrefixLookupReply(count=self.store.prefix_lookup(request.namespace, keys))

    def delete(self, request: pb.DeleteRequest) -> pb.DeleteReply:
        keys = _check_keys(request.namespace, request.keys)
        return pb.DeleteReply(deleted=self.store.delete(request.namespace, keys))

    def flush(self, request: pb.FlushRequest) -> pb.FlushReply:
        _check_keys(request.namespace, [])
        return pb.FlushReply(deleted=self.store.flush(request.namespace))

    def stats(self, _request: pb.StatsRequest) -> pb.StatsReply:
        s = self.store.stats()
        with self._io_lock:
            bytes_in, bytes_out = self._bytes_in, self._bytes_out
        return pb.StatsReply(
            version=__version__,
            role=self.role,
            keys=s.keys,
            used_bytes=s.used_bytes,
            max_bytes=s.max_bytes,
            hits=s.hits,
            misses=s.misses,
            evictions=s.evictions,
            corrupt=s.corrupt,
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            uptime_s=time.monotonic() - self.started,
            sync_mode=self.store.sync_mode,
            policy=self.store.policy.name,
            path=str(self.store.path),
            bulk_port=self.bulk_port,
        )

    def _count_io(self, *, bytes_in: int = 0, bytes_out: int = 0) -> None:
        with self._io_lock:
            self._bytes_in += bytes_in
            self._bytes_out += bytes_out
        if bytes_in:
            self.metrics.bytes_in.inc(bytes_in)
        if bytes_out:
            self.metrics.bytes_out.inc(bytes_out)


def _identity(value: Any) -> Any:
    return value


def parse_message(message_type: type[M], data: bytes) -> M:
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a {message_type.__name__}: {exc}") from exc


def _check_keys(namespace: bytes, keys: Iterable[bytes]) -> list[bytes]:
    if len(namespace) > MAX_NAMESPACE_BYTES:
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"namespace longer than {MAX_NAMESPACE_BYTES} bytes")
    out = list(keys)
    if len(out) > MAX_KEYS_PER_CALL:
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"more than {MAX_KEYS_PER_CALL} keys in one call")
    for key in out:
        if not key or len(key) > MAX_KEY_BYTES:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"key length {len(key)} outside 1..{MAX_KEY_BYTES}")
    return out


def _abort(context: grpc.ServicerContext, exc: Abort) -> NoReturn:
    if exc.code is not grpc.StatusCode.UNAVAILABLE:
        log.info("rejecting call: %s %s", exc.code.name, exc.details)
    context.abort(exc.code, exc.details)
