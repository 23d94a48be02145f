"""The ``tierkv.v1.Vault`` methods, transport-neutral: validate, confine to the caller's tenant, call the
store, answer.

Both front ends (:mod:`tierkv.vault.grpc_edge`, :mod:`tierkv.vault.bulk`) run every call inside
:meth:`Calls.scope <tierkv.vault.calls.Calls.scope>`, which authenticates the caller to a
:class:`~tierkv.vault.auth.Principal`, and hand this module parsed requests. Errors are
:class:`~tierkv.vault.status.Abort` with a :class:`~tierkv.vault.status.Status`; nothing here knows gRPC.
Put and BatchGet carry blobs in hand-built frames (``tierkv.wire.framing``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from tierkv import __version__
from tierkv.limits import (
    MAX_BATCH_BYTES,
    MAX_ITEM_BYTES,
    MAX_KEYS_PER_CALL,
    MAX_MESSAGE_BYTES,
    check_key,
    check_namespace,
)
from tierkv.retention.classes import BlockMeta
from tierkv.vault.auth import Principal
from tierkv.vault.calls import Calls
from tierkv.vault.hottest import hottest
from tierkv.vault.memory import LARGE_CALL_BYTES
from tierkv.vault.reply import BatchGetReply
from tierkv.vault.status import Abort, Status, invalid
from tierkv.vault.store import Lookup, Store, StoreFullError, split_full_key
from tierkv.vault.successors import (
    DEFAULT_SUGGEST_BYTES,
    DEFAULT_SUGGEST_KEYS,
    MAX_SUGGEST_KEYS,
    TenantLearners,
)
from tierkv.wire import FrameDecoder, FrameError, pb
from tierkv.wire.framing import Buffer
from tierkv.wire.records import to_message

M = TypeVar("M", bound=Message)
MAX_LISTED_NAMESPACES = 10_000
"""The most namespaces one ListNamespaces reply names (about 4 MB of reply)."""
_ITEM_STATUS = {Lookup.FOUND: pb.FOUND, Lookup.MISSING: pb.MISSING, Lookup.CORRUPT: pb.CORRUPT}


@dataclasses.dataclass(frozen=True)
class Limits:
    frame_bytes: int = 4 * 1024 * 1024
    max_item_bytes: int = MAX_ITEM_BYTES
    max_batch_bytes: int = MAX_BATCH_BYTES
    max_message_bytes: int = MAX_MESSAGE_BYTES
    """The largest frame a Put may send (gRPC enforces it on its own messages, the bulk port here)."""


@dataclasses.dataclass
class PutBatch:
    """A Put's decoded blobs: (key, blob, priority) and metadata, by position."""

    namespace: bytes = b""
    items: list[tuple[bytes, bytes | bytearray | memoryview, int]] = dataclasses.field(default_factory=list)
    metas: list[BlockMeta | None] = dataclasses.field(default_factory=list)
    nbytes: int = 0


class VaultService:
    """The methods of one vault over one store. ``bulk_port`` is what Stats advertises (0: none)."""

    def __init__(
        self,
        store: Store,
        *,
        role: str,
        limits: Limits,
        calls: Calls,
        bulk_port: int = 0,
        successors: TenantLearners | None = None,
    ) -> None:
        self.store = store
        self.learner = successors or TenantLearners(store.tenant_names)
        store.on_drop = self._forget
        self.role = role
        self.limits = limits
        self.calls = calls
        self.metrics = calls.metrics
        self.bulk_port = bulk_port
        self.started = time.monotonic()
        self._bytes_in = 0
        self._bytes_out = 0
        self._io_lock = threading.Lock()

    # -- methods -----------------------------------------------------------------------------------

    def put(self, who: Principal, frames: Iterable[Buffer]) -> pb.PutReply:
        return self.store_put(who, self.read_put(frames))

    def read_put(self, frames: Iterable[Buffer]) -> PutBatch:
        """A Put's blobs, decoded and validated as its frames arrive; nothing is stored yet."""
        decoder = FrameDecoder(
            max_item_bytes=self.limits.max_item_bytes, max_total_bytes=self.limits.max_batch_bytes
        )
        batch = PutBatch()
        try:
            for frame in frames:
                for blob in decoder.feed(frame):
                    if blob.data is None:
                        raise FrameError("a Put segment must carry a blob")
                    batch.items.append((blob.key, blob.data, blob.priority))
                    batch.metas.append(blob.meta)
            decoder.close()
        except (
            IndexError,
            KeyError,
            OverflowError,
        ) as exc:  # a parser slip on hostile input: still its fault
            raise invalid(f"malformed frame: {type(exc).__name__}") from exc
        batch.namespace = decoder.namespace or b""
        batch.nbytes = decoder.total_bytes
        return batch

    def store_put(self, who: Principal, batch: PutBatch) -> pb.PutReply:
        """Write what :meth:`read_put` decoded, in the caller's tenant."""
        items, metas = batch.items, batch.metas
        if not items:
            return pb.PutReply()
        try:
            tagged = any(m is not None for m in metas)
            outcome = self.store.put_many(
                batch.namespace, items, tenant=who.tenant, metas=metas if tagged else None
            )
        except StoreFullError as exc:
            raise Abort(Status.RESOURCE_EXHAUSTED, str(exc)) from exc
        skip = set(outcome.rejected)
        self.learner.stored(
            who.tenant,
            batch.namespace,
            ((key, len(data), metas[i]) for i, (key, data, _) in enumerate(items) if i not in skip),
        )
        nbytes = batch.nbytes
        if nbytes >= LARGE_CALL_BYTES:
            self.calls.memory.large_call_ended()
        self._count_io(bytes_in=nbytes)
        self.metrics.batch_bytes.labels("Put").observe(nbytes)
        return pb.PutReply(
            stored=outcome.stored,
            rejected=len(outcome.rejected),
            evicted=outcome.evicted,
            rejected_index=outcome.rejected,
        )

    def batch_get(self, who: Principal, request: pb.BatchGetRequest) -> BatchGetReply:
        """The reply to send; the caller iterates its frames and closes it (see :mod:`.reply`)."""
        keys = _check_keys(request.namespace, request.keys)
        reader = self.store.reader(who.tenant)
        self.learner.fetched(who.tenant, request.namespace, keys)
        return BatchGetReply(reader, request.namespace, keys, frame_bytes=self.limits.frame_bytes)

    def finish_batch_get(self, reply: BatchGetReply) -> None:
        reply.close()
        self._count_io(bytes_out=reply.sent_bytes)
        self.metrics.batch_bytes.labels("BatchGet").observe(reply.sent_bytes)

    def prefix_lookup(self, who: Principal, request: pb.PrefixLookupRequest) -> pb.PrefixLookupReply:
        keys = _check_keys(request.namespace, request.keys)
        return pb.PrefixLookupReply(
            count=self.store.prefix_lookup(
                request.namespace, keys, tenant=who.tenant, lease_ms=request.lease_ms
            )
        )

    def delete(self, who: Principal, request: pb.DeleteRequest) -> pb.DeleteReply:
        keys = _check_keys(request.namespace, request.keys)
        tenant = self._tenant(who, request.tenant)
        return pb.DeleteReply(deleted=self.store.delete(request.namespace, keys, tenant=tenant))

    def flush(self, who: Principal, request: pb.FlushRequest) -> pb.FlushReply:
        """One namespace, or — asked for explicitly, by an admin — every namespace (of one tenant or all)."""
        _check_keys(request.namespace, [])
        if request.all_namespaces:
            if request.namespace:
                raise invalid("Flush takes a namespace or all_namespaces, not both")
            if not who.admin:
                raise Abort(Status.PERMISSION_DENIED, "flushing every namespace needs the admin role")
            tenant = self._tenant(who, request.tenant) if request.tenant else None
            deleted = self.store.flush(b"", tenant=tenant)
            self.learner.forget_tenant(tenant)
            return pb.FlushReply(deleted=deleted)
        if not request.namespace:
            raise invalid("Flush needs a namespace (or all_namespaces = true to empty every namespace)")
        tenant = self._tenant(who, request.tenant)
        return pb.FlushReply(deleted=self.store.flush(request.namespace, tenant=tenant))

    def stats(self, who: Principal, _request: pb.StatsRequest) -> pb.StatsReply:
        """The vault's figures for an admin; a user sees its own tenant's, and no path."""
        s = self.store.stats(None if who.admin else who.tenant)
        reply = pb.StatsReply(
            version=__version__,
            role=self.role,
            keys=s.keys,
            used_bytes=s.used_bytes,
            max_bytes=s.max_bytes,
            hits=s.hits,
            misses=s.misses,
            evictions=s.evictions,
            corrupt=s.corrupt,
            uptime_s=time.monotonic() - self.started,
            sync_mode=self.store.sync_mode,
            policy=self.store.policy.name,
            bulk_port=self.bulk_port,
            bulk_put=bool(self.bulk_port),
            bulk_lookup=bool(self.bulk_port),
            tenant=who.tenant,
            access=who.access.value,
            expired=s.expired,
            protected_bytes=s.protected_bytes,
            protected_overflow=s.protected_overflow,
            leases=to_message(s.leases, pb.LeaseStats),
        )
        for c in self.store.class_usage(None if who.admin else who.tenant):
            reply.classes.append(to_message(c, pb.ClassStats))
        if who.admin:
            with self._io_lock:
                reply.bytes_in, reply.bytes_out = self._bytes_in, self._bytes_out
            reply.path = str(self.store.path)
            for u in self.store.tenant_usage():
                reply.tenants.append(to_message(u, pb.TenantStats))
        return reply

    def list_namespaces(self, who: Principal, request: pb.ListNamespacesRequest) -> pb.ListNamespacesReply:
        """A user's own namespaces; an admin's choice of one tenant's, or every tenant's."""
        if request.tenant:
            tenant: str | None = self._tenant(who, request.tenant)
        else:
            tenant = None if who.admin else who.tenant
        limit = min(request.limit or MAX_LISTED_NAMESPACES, MAX_LISTED_NAMESPACES)
        found, truncated = self.store.namespaces(tenant, limit=limit)
        reply = pb.ListNamespacesReply(truncated=truncated)
        for u in found:
            reply.namespaces.add(
                tenant=u.tenant,
                namespace=u.namespace,
                keys=u.keys,
                bytes=u.used_bytes,
                protected_bytes=u.protected_bytes,
                sample_key=u.sample_key,
                head=u.head,
            )
        return reply

    def inspect(self, who: Principal, request: pb.InspectRequest) -> pb.InspectReply:
        """One entry: blob size and head, charge, priority and its retention record; not a read."""
        _check_keys(request.namespace, [request.key])
        tenant = self._tenant(who, request.tenant)
        found = self.store.inspect(request.namespace, request.key, tenant=tenant)
        reply = pb.InspectReply(
            status=_ITEM_STATUS[found.status],
            tenant=tenant,
            size=found.size,
            charge=found.charge,
            priority=found.priority,
            head=found.head,
        )
        meta = found.meta
        if meta is not None:
            reply.has_meta = True
            reply.source, reply.importance, reply.protected = meta.source, meta.importance, meta.protected
            reply.expiry, reply.expired = meta.expiry, meta.expired(time.time())
            reply.hits, reply.children, reply.parent = meta.hits, meta.sharing, meta.parent
        return reply

    def hottest(self, who: Principal, request: pb.HottestRequest) -> pb.HottestReply:
        """A namespace's most-hit chains with their token ids (:mod:`tierkv.vault.hottest`); not a read."""
        _check_keys(request.namespace, [])
        tenant = self._tenant(who, request.tenant)
        found = hottest(self.store, request.namespace, tenant=tenant, limit=request.limit)
        reply = pb.HottestReply(truncated=found.truncated)
        for c in found.chains:
            reply.chains.add(keys=c.keys, hits=c.hits, source=c.source, tokens=c.tokens)
        return reply

    def successors(self, who: Principal, request: pb.SuccessorsRequest) -> pb.SuccessorsReply:
        """The caller's likely next blocks after a chain (its own tenant's only); reads nothing from disk."""
        keys = _check_keys(request.namespace, request.keys)
        if not keys:
            raise invalid("Successors needs the chain just fetched (at least one key)")
        max_keys = min(request.max_keys or DEFAULT_SUGGEST_KEYS, MAX_SUGGEST_KEYS)
        max_bytes = request.max_bytes or DEFAULT_SUGGEST_BYTES
        found = self.learner.successors(
            who.tenant, request.namespace, keys, max_bytes=max_bytes, max_keys=max_keys
        )
        reply = pb.SuccessorsReply()
        for s in found:
            reply.successors.add(key=s.key, size=s.size, score=s.score)
        return reply

    # -- helpers -----------------------------------------------------------------------------------

    def _forget(self, dropped: Sequence[tuple[str, bytes]]) -> None:
        """The store removed these (tenant, full key) entries: they are no longer suggested."""
        self.learner.forget((tenant, *split_full_key(fkey)) for tenant, fkey in dropped)

    def _tenant(self, who: Principal, requested: str) -> str:
        """The tenant a call acts in: the caller's own, or (admin only) the one it names."""
        if not requested or requested == who.tenant:
            return who.tenant
        if not who.admin:
            raise Abort(
                Status.PERMISSION_DENIED, "acting in another tenant's namespaces needs the admin role"
            )
        if requested not in self.store.tenant_names:
            raise Abort(Status.NOT_FOUND, f"no tenant {requested!r} on this vault")
        return requested

    def _count_io(self, *, bytes_in: int = 0, bytes_out: int = 0) -> None:
        with self._io_lock:
            self._bytes_in += bytes_in
            self._bytes_out += bytes_out
        if bytes_in:
            self.metrics.bytes_in.inc(bytes_in)
        if bytes_out:
            self.metrics.bytes_out.inc(bytes_out)


def parse_message(message_type: type[M], data: bytes) -> M:
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        raise invalid(f"not a {message_type.__name__}: {exc}") from exc


def parse_canonical(message_type: type[M], data: bytes) -> M:
    """Parse a request that must be unambiguous: it has to be exactly how protobuf itself would encode
    it (no unknown fields, no odd wire types or varints), so a flipped bit cannot turn into a valid call."""
    message = parse_message(message_type, data)
    message.DiscardUnknownFields()
    if message.SerializeToString(deterministic=True) != bytes(data):
        raise invalid(f"not a canonically encoded {message_type.__name__} (unknown or malformed fields)")
    return message


def _check_keys(namespace: bytes, keys: Iterable[bytes]) -> list[bytes]:
    try:
        check_namespace(namespace)
        out = list(keys)
        if len(out) > MAX_KEYS_PER_CALL:
            raise ValueError(f"more than {MAX_KEYS_PER_CALL} keys in one call")
        for key in out:
            check_key(key)
    except ValueError as exc:
        raise invalid(str(exc)) from exc
    return out
