"""Sans-IO pieces shared by every client and transport: options, reply parsing and assembly, put
batching, and the one place where status codes (gRPC's, or a bulk ERROR record's) become tierkv
exceptions. Nothing here does I/O."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from tierkv.client.plain import plain_details
from tierkv.client.types import EntryInfo, EntryStatus, NamespaceInfo, VaultStats
from tierkv.codec.landing import Landing, LandingSink
from tierkv.config import TLSConfig
from tierkv.errors import (
    AuthError,
    InvalidRequest,
    ResourceExhausted,
    VaultError,
    VaultUnavailable,
)
from tierkv.limits import (
    CLIENT_BATCH_BYTES,
    FRAME_BYTES,
    MAX_AUTH_TOKEN_BYTES,
    MAX_HOTTEST_REPLY_BYTES,
    MAX_MESSAGE_BYTES,
)
from tierkv.records import ClassStats, HotChain, LeaseCounts, TenantStats
from tierkv.retention.classes import BlockMeta, unpack_tokens
from tierkv.wire import Blob, FrameDecoder, FrameError, encode_frames, pb
from tierkv.wire.framing import FOUND, Buffer, encode_frame_parts, read_frame_head, split_body
from tierkv.wire.records import from_message

M = TypeVar("M", bound=Message)

_UNAVAILABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
}
_MAPPED: dict[grpc.StatusCode, type[VaultError]] = {
    grpc.StatusCode.UNAUTHENTICATED: AuthError,
    grpc.StatusCode.PERMISSION_DENIED: AuthError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
}

Items = Mapping[bytes, Buffer] | Iterable[tuple[bytes, Buffer]]
Metas = Mapping[bytes, BlockMeta]
"""Retention metadata by key; a key it does not name is stored untagged (and costs nothing extra)."""


@dataclasses.dataclass(frozen=True)
class ClientOptions:
    """Knobs common to both clients. ``min_bytes_per_s`` stretches a Put's deadline with its size."""

    timeout: float = 2.0
    token: str | None = None
    tls: TLSConfig | None = None
    max_message_bytes: int = MAX_MESSAGE_BYTES
    frame_bytes: int = FRAME_BYTES
    max_batch_bytes: int = CLIENT_BATCH_BYTES
    min_bytes_per_s: float = 100e6
    bulk: bool = True

    def __post_init__(self) -> None:
        if self.token and len(self.token.encode()) > MAX_AUTH_TOKEN_BYTES:
            raise ValueError(
                f"a token of {len(self.token.encode())} bytes: vaults take at most {MAX_AUTH_TOKEN_BYTES}"
            )

    @property
    def tls_enabled(self) -> bool:
        return self.tls is not None and self.tls.enabled

    def channel_options(self) -> list[tuple[str, Any]]:
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.enable_retries", 0),
            # reconnect quickly after a vault restarts; our circuit breaker is what limits hammering.
            # Not grpc.min_reconnect_backoff_ms: gRPC takes it as the time a connection attempt is given
            # at least, and at 100 ms every call to a vault slow to send its first bytes (a busy machine,
            # a long link) failed at once until the backoff outgrew the delay; calls have deadlines
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]

    def credentials(self) -> grpc.ChannelCredentials | None:
        tls = self.tls
        if tls is None or not tls.enabled:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(tls.ca_file),
            private_key=_read(tls.key_file),
            certificate_chain=_read(tls.cert_file),
        )

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def deadline(self, timeout: float | None = None) -> float:
        """The monotonic time by which a call started now must be answered."""
        return time.monotonic() + (self.timeout if timeout is None else timeout)

    def put_deadline(self, nbytes: int) -> float:
        """A Put's deadline stretches with its size (``min_bytes_per_s``)."""
        return self.deadline(self.timeout + nbytes / self.min_bytes_per_s)


def _read(path: str) -> bytes | None:
    return Path(path).expanduser().read_bytes() if path else None


def map_error(exc: grpc.RpcError, address: str) -> VaultError:
    """Translate a gRPC failure into the tierkv exception tree (the only place this happens)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    return error_for(code.name if code is not None else "UNKNOWN", details, address)


def error_for(name: str, details: str, address: str) -> VaultError:
    """The tierkv exception for a status named ``name`` (gRPC's, or a bulk-channel ERROR record's)."""
    code = getattr(grpc.StatusCode, name, None)
    if code in _UNAVAILABLE:
        return VaultUnavailable(f"{name}: {plain_details(details)}", address=address, code=name)
    cls = _MAPPED.get(code, VaultError) if isinstance(code, grpc.StatusCode) else VaultError
    return cls(f"{name}: {details}", address=address, code=name)


def put_batches(
    items: Items, options: ClientOptions, priority: int, meta: Metas | None = None
) -> Iterator[list[Blob]]:
    """Split a put into RPC-sized batches (each written by the vault in write transactions of at most a
    sixteenth of its budget: one for most batches, several for a large one)."""
    pairs = items.items() if isinstance(items, Mapping) else items
    batch: list[Blob] = []
    size = 0
    for i, (key, data) in enumerate(pairs):
        n = len(data)
        if batch and size + n > options.max_batch_bytes:
            yield batch
            batch, size = [], 0
        batch.append(
            Blob(key=key, data=data, index=i, priority=priority, meta=meta.get(key) if meta else None)
        )
        size += n
    if batch:
        yield batch


@dataclasses.dataclass(frozen=True)
class PutFrames:
    """One Put batch's frames, which can be produced more than once: a Put refused by the bulk port is
    sent again over gRPC. gRPC streams the joined frames; the bulk port sends :meth:`parts`, gather lists
    that still point into the caller's blobs."""

    namespace: bytes
    batch: Sequence[Blob]
    frame_bytes: int

    def __iter__(self) -> Iterator[bytes]:
        return encode_frames(self.batch, frame_bytes=self.frame_bytes, namespace=self.namespace)

    def parts(self) -> Iterator[list[Buffer]]:
        return encode_frame_parts(self.batch, frame_bytes=self.frame_bytes, namespace=self.namespace)


def put_frames(namespace: bytes, batch: Sequence[Blob], options: ClientOptions) -> PutFrames:
    return PutFrames(namespace, batch, options.frame_bytes)


def batch_bytes(batch: Sequence[Blob]) -> int:
    return sum(len(b.data) for b in batch if b.data is not None)


def keys_request(
    message: type[pb.BatchGetRequest | pb.PrefixLookupRequest],
    namespace: bytes,
    keys: Sequence[bytes],
) -> bytes:
    return message(namespace=namespace, keys=list(keys)).SerializeToString()


def lookup_request(namespace: bytes, keys: Sequence[bytes], lease_ms: int) -> bytes:
    """A PrefixLookup request; ``lease_ms`` outside uint32 is a ValueError here, not on the wire."""
    if not 0 <= lease_ms <= 0xFFFFFFFF:
        raise ValueError(f"lease_ms must be in [0, 2**32), got {lease_ms}")
    return pb.PrefixLookupRequest(namespace=namespace, keys=list(keys), lease_ms=lease_ms).SerializeToString()


def parse_reply(message: type[M], raw: Buffer, address: str) -> M:
    """A vault's reply message; bytes that do not parse are a :class:`VaultError`, like any bad answer."""
    try:
        return message.FromString(bytes(raw))
    except DecodeError as exc:
        raise VaultError(f"malformed {message.DESCRIPTOR.name}: {exc}", address=address) from None


def refused(reply: pb.PutReply, batch: int, address: str) -> set[int]:
    """The positions a Put reply refused among the ``batch`` blobs sent; a VaultError when the reply does
    not account for every blob exactly once (garbage that happens to parse stores nothing)."""
    positions = set(reply.rejected_index)
    if (
        reply.rejected != len(reply.rejected_index)
        or len(positions) != reply.rejected
        or any(i >= batch for i in positions)
        or reply.stored + reply.rejected != batch
    ):
        raise VaultError(
            f"malformed PutReply: {reply.stored} stored and {reply.rejected} rejected "
            f"({len(reply.rejected_index)} positions) of {batch} blobs sent",
            address=address,
        )
    return positions


BlobSink = Callable[[int, Buffer], None]
"""Called with ``(index of the key, blob)`` as each found blob of a BatchGet arrives; must not raise, and
the blob is valid only during the call."""


class FrameReader(Protocol):
    """Exact reads of one reply frame from a transport (the bulk port's connection)."""

    def read(self, n: int) -> Buffer:
        """The next ``n`` bytes, valid until the next read."""

    def read_into(self, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers`` in order with the next bytes."""


class GetAssembler:
    """Collects BatchGet frames into one result per requested key, in request order. Whatever a peer
    sends, it raises nothing but :class:`VaultError`.

    Without ``on_blob`` each found blob is kept in ``results``; with it, each is handed to ``on_blob`` as
    soon as it is complete and only its size is kept (``sizes``), so the frame it came in can be reused
    for the next one. A transport that reads frames itself calls :meth:`receive` instead of passing
    whole frames: then an ``on_blob`` that is a :class:`~tierkv.codec.landing.LandingSink` gets each blob
    that lies whole in one frame received straight into the memory it offers.
    """

    def __init__(self, n_keys: int, address: str, on_blob: BlobSink | None = None) -> None:
        self.address = address
        self.results: list[Buffer | None] = [None] * n_keys
        self.sizes: list[int | None] = [None] * n_keys
        self._decoder = FrameDecoder(max_item_bytes=1 << 40)
        self._on_blob = on_blob
        self._lands = on_blob if isinstance(on_blob, LandingSink) else None

    def feed(self, frame: Buffer) -> None:
        """One whole frame."""
        with self._malformed("malformed BatchGet reply"):
            blobs = self._decoder.feed(frame)
        self._deliver(blobs, {})

    __call__ = feed
    """A transport's sink: fed whole frames, unless it reads them through :meth:`receive`."""

    def receive(self, reader: FrameReader, length: int) -> None:
        """Read one ``length``-byte frame through ``reader``, landing the blobs the sink takes (a sink
        that lands nothing gets the frame read whole, in one read, as from :meth:`feed`)."""
        if self._lands is None:
            self.feed(reader.read(length))
            return
        with self._malformed("malformed BatchGet reply"):
            head = read_frame_head(reader.read, length)
        if not isinstance(head, tuple):
            self.feed(head + bytes(reader.read(length - len(head))))
            return
        header, body_len = head
        with self._malformed("malformed BatchGet reply"):
            self._decoder.check(header, body_len)
        landings = self._landings(header)
        if not landings:
            pieces = split_body(reader.read(body_len), header)
            self._deliver(self._take(header, pieces), {})
            return
        open_landings = {header.segments[k].index: landing for k, landing in landings.items()}
        try:
            buffers: list[memoryview] = []
            pieces = []
            for k, seg in enumerate(header.segments):
                piece = _NOTHING if k in landings else memoryview(bytearray(seg.length))
                buffers.extend(landings[k].buffers if k in landings else [piece])
                pieces.append(piece)
            reader.read_into(buffers)
            self._deliver(self._take(header, pieces), open_landings)
        finally:
            for landing in open_landings.values():  # the reply broke off or turned out malformed
                landing.abandon()

    def _take(self, header: pb.FrameHeader, pieces: list[memoryview]) -> list[Blob]:
        with self._malformed("malformed BatchGet reply"):
            return self._decoder.take(header, pieces)

    def _landings(self, header: pb.FrameHeader) -> dict[int, Landing]:
        """The landing for each segment the sink takes whole (by segment position in the frame)."""
        if self._lands is None or self._decoder.midway:
            return {}
        out: dict[int, Landing] = {}
        keys: set[int] = set()
        for k, seg in enumerate(header.segments):
            if seg.status != FOUND or not seg.size or seg.length != seg.size or seg.index in keys:
                continue
            if not 0 <= seg.index < len(self.sizes) or self.sizes[seg.index] is not None:
                continue
            landing = self._lands.land(seg.index, seg.size)
            if landing is None:
                continue
            if sum(len(b) for b in landing.buffers) != seg.size:  # would desynchronise the stream
                landing.abandon()
                continue
            out[k] = landing
            keys.add(seg.index)
        return out

    def _deliver(self, blobs: list[Blob], landed: dict[int, Landing]) -> None:
        """Hand each blob over, or end its landing (taking it out of ``landed``: whatever is left there
        when this raises was never ended)."""
        for blob in blobs:
            if not 0 <= blob.index < len(self.results):
                raise VaultError("BatchGet reply names a key that was not asked for", address=self.address)
            if blob.status != FOUND or blob.data is None:
                continue
            if self.sizes[blob.index] is not None:
                raise VaultError("BatchGet reply names a key twice", address=self.address)
            landing = landed.pop(blob.index, None)
            if landing is not None:
                self.sizes[blob.index] = sum(len(b) for b in landing.buffers)
                landing.landed()
                continue
            self.sizes[blob.index] = len(blob.data)
            if self._on_blob is None:
                self.results[blob.index] = blob.data
            else:
                self._on_blob(blob.index, blob.data)

    @contextlib.contextmanager
    def _malformed(self, what: str) -> Iterator[None]:
        try:
            yield
        except FrameError as exc:
            raise VaultError(f"{what}: {exc}", address=self.address) from None

    def finish(self) -> list[Buffer | None]:
        with self._malformed("truncated BatchGet reply"):
            self._decoder.close()
        return self.results


_NOTHING = memoryview(b"")
"""The piece of a segment that was landed: its bytes are where its landing put them."""


def as_bytes(results: Sequence[Buffer | None]) -> list[bytes | None]:
    return [None if r is None else bytes(r) for r in results]


_ENTRY_STATUS = {
    pb.FOUND: EntryStatus.FOUND,
    pb.MISSING: EntryStatus.MISSING,
    pb.CORRUPT: EntryStatus.CORRUPT,
}


def entry_from_reply(r: pb.InspectReply, address: str) -> EntryInfo:
    status = _ENTRY_STATUS.get(r.status)
    if status is None:
        raise VaultError(f"Inspect reply with status {r.status}", address=address)
    return EntryInfo(
        status=status,
        tenant=r.tenant,
        size=r.size,
        charge=r.charge,
        priority=r.priority,
        head=r.head,
        has_meta=r.has_meta,
        source=r.source,
        importance=r.importance,
        protected=r.protected,
        expiry=r.expiry,
        expired=r.expired,
        hits=r.hits,
        children=r.children,
        parent=r.parent,
    )


def chain_from_reply(c: pb.HotChain, address: str) -> HotChain:
    """One chain of a Hottest reply; its token ids span many blocks (a reply holds at most
    :data:`~tierkv.limits.MAX_HOTTEST_REPLY_BYTES`)."""
    try:
        tokens = unpack_tokens(c.tokens, MAX_HOTTEST_REPLY_BYTES)
    except ValueError as exc:
        raise VaultError(f"Hottest reply: {exc}", address=address) from None
    return HotChain(keys=tuple(c.keys), hits=c.hits, source=c.source, tokens=tokens)


def namespace_from_reply(n: pb.NamespaceStats) -> NamespaceInfo:
    return NamespaceInfo(
        tenant=n.tenant,
        namespace=n.namespace,
        keys=n.keys,
        used_bytes=n.bytes,
        protected_bytes=n.protected_bytes,
        sample_key=n.sample_key,
        head=n.head,
    )


def stats_from_reply(r: pb.StatsReply) -> VaultStats:
    return VaultStats(
        version=r.version,
        role=r.role,
        keys=r.keys,
        used_bytes=r.used_bytes,
        max_bytes=r.max_bytes,
        hits=r.hits,
        misses=r.misses,
        evictions=r.evictions,
        corrupt=r.corrupt,
        bytes_in=r.bytes_in,
        bytes_out=r.bytes_out,
        bulk_port=r.bulk_port,
        bulk_put=r.bulk_put,
        bulk_lookup=r.bulk_lookup,
        uptime_s=r.uptime_s,
        sync_mode=r.sync_mode,
        policy=r.policy,
        path=r.path,
        expired=r.expired,
        protected_bytes=r.protected_bytes,
        protected_overflow=r.protected_overflow,
        leases=from_message(r.leases, LeaseCounts),
        tenant=r.tenant,
        access=r.access,
        tenants=tuple(from_message(t, TenantStats) for t in r.tenants),
        classes=tuple(from_message(c, ClassStats) for c in r.classes),
    )
