"""The one seam between the pipeline and the vaults: a small storage Protocol and its implementations.

Every engine hook reaches the cold tier through :class:`Storage` only. Three things satisfy it:

- :class:`tierkv.client.cluster.Cluster` (structurally; :func:`open_cluster` builds one from tierkv.toml),
  the real thing: roles, sharding, replication, deadlines; it never raises because a vault failed;
- :class:`MemoryStorage`, a dict per (role, namespace), for unit tests of the pipeline and of hooks;
- :class:`LazyStorage`, which opens another storage on first use (a hook that must not open sockets
  before its engine forks, or whose threads may all ask for it at once).

A put answers a :class:`~tierkv.acks.PutResult`: how many blobs the vaults' replies said they stored, which
they refused and why, and which have fewer copies than asked; never what was merely sent.

``meta`` on a put is each block's retention metadata (:class:`~tierkv.retention.BlockMeta`), keyed like
``items``; a key without an entry (or ``meta=None``) is stored untagged, exactly as a store without a
layout always was. It travels with the blobs so every hook tags its blocks through this one path.

``role`` is a cold role name (``"kv_cold"`` / ``"ssm_cold"``; :class:`tierkv.roles.Role` members are
accepted as they are strings). Which role a blob goes to is decided once, by :func:`tierkv.roles.role_for`.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from tierkv.acks import PutResult
from tierkv.codec import Buffer
from tierkv.config import Config
from tierkv.retention import BlockMeta
from tierkv.roles import Role

BlobSink = Callable[[int, Buffer], None]
"""``(index of the key, blob)`` for each blob a get finds, possibly on another thread while the rest of the
reply is still arriving; it must not raise, and the blob is valid only during the call."""


class Storage(Protocol):
    """What the pipeline needs from the vaults. Failures are misses (``None``, 0), never exceptions."""

    def put(
        self,
        namespace: bytes,
        items: Mapping[bytes, bytes],
        role: str = ...,
        *,
        meta: Mapping[bytes, BlockMeta] | None = None,
    ) -> PutResult:
        """Store blobs (with the metadata ``meta`` gives for some of them); what the vaults stored."""
        ...

    def get_buffers(
        self, namespace: bytes, keys: Sequence[bytes], role: str = ...
    ) -> Sequence[Buffer | None]:
        """One blob (or ``None``) per key, in order."""
        ...

    def get_each(
        self, namespace: bytes, keys: Sequence[bytes], on_blob: BlobSink, role: str = ...
    ) -> Sequence[int | None]:
        """One get that hands each found blob to ``on_blob`` (see :data:`BlobSink`) at most once, as soon
        as it arrives and never after the call returned, and keeps none; each key's blob size or None."""
        ...

    def prefix_lookup(
        self, namespace: bytes, keys: Sequence[bytes], role: str = ..., *, lease_ms: int = ...
    ) -> int:
        """Length of the leading run of ``keys`` that is present (never over-reports); ``lease_ms`` asks
        the vaults to keep those blocks that long or until they are read (0: no lease)."""
        ...

    def delete(self, namespace: bytes, keys: Sequence[bytes], role: str = ...) -> int:
        """Remove keys; returns how many entries were removed."""
        ...

    def close(self) -> None:
        """Release connections; the storage is not used afterwards."""
        ...


def put_tagged(
    storage: Storage,
    namespace: bytes,
    items: Mapping[bytes, bytes],
    role: str,
    meta: Mapping[bytes, BlockMeta] | None,
) -> PutResult:
    """``storage.put`` with ``meta`` passed only when some block carries metadata: an untagged store is
    exactly the call it always was (and reaches a storage that does not know the keyword)."""
    if meta:
        return storage.put(namespace, items, role=role, meta=meta)
    return storage.put(namespace, items, role=role)


def open_cluster(
    config: Config, roles: Mapping[str, Sequence[str]] | None = None, **overrides: Any
) -> Storage:
    """A :class:`~tierkv.client.cluster.Cluster` from ``[cluster]``, ``[auth]`` and ``[tls]`` of ``config``.

    ``roles`` replaces the file's vault addresses; ``overrides`` replace cluster options (``timeout``, …).
    Hooks call this instead of importing the client, so the client stays behind the Protocol. The
    client (and grpc) is imported here, on first use: the pipeline itself runs without it.
    """
    from tierkv.client.cluster import Cluster

    return Cluster.from_config(config, roles=roles, **overrides)


class MemoryStorage:
    """An in-process :class:`Storage`: blobs in a dict per (role, namespace).

    ``blobs`` is public so a test can corrupt or drop a stored blob; ``meta`` holds the metadata the
    last put of each key carried (a put without any drops it, as the vault does); ``calls`` counts
    operations by name (``"put"``, ``"get"``, ``"lookup"``, ``"delete"``) so a test can check how often a
    hook asks.
    """

    def __init__(self) -> None:
        self.blobs: dict[tuple[str, bytes], dict[bytes, bytes]] = defaultdict(dict)
        self.meta: dict[tuple[str, bytes], dict[bytes, BlockMeta]] = defaultdict(dict)
        self.calls: dict[str, int] = defaultdict(int)
        self.closed = False
        self._lock = threading.Lock()

    def _space(self, namespace: bytes, role: str) -> dict[bytes, bytes]:
        return self.blobs[(str(Role.parse(role)), namespace)]

    def _meta(self, namespace: bytes, role: str) -> dict[bytes, BlockMeta]:
        return self.meta[(str(Role.parse(role)), namespace)]

    def put(
        self,
        namespace: bytes,
        items: Mapping[bytes, bytes],
        role: str = Role.KV_COLD,
        *,
        meta: Mapping[bytes, BlockMeta] | None = None,
    ) -> PutResult:
        with self._lock:
            self.calls["put"] += 1
            self._space(namespace, role).update((k, bytes(v)) for k, v in items.items())
            tags = self._meta(namespace, role)
            for k in items:
                m = meta.get(k) if meta else None
                if m is None:
                    tags.pop(k, None)
                else:
                    tags[k] = m
            return PutResult.every(len(items))

    def get_buffers(
        self, namespace: bytes, keys: Sequence[bytes], role: str = Role.KV_COLD
    ) -> list[Buffer | None]:
        with self._lock:
            self.calls["get"] += 1
            space = self._space(namespace, role)
            return [space.get(k) for k in keys]

    def get_each(
        self, namespace: bytes, keys: Sequence[bytes], on_blob: BlobSink, role: str = Role.KV_COLD
    ) -> list[int | None]:
        found = self.get_buffers(namespace, keys, role)
        for i, blob in enumerate(found):
            if blob is not None:
                on_blob(i, blob)
        return [None if blob is None else len(blob) for blob in found]

    def prefix_lookup(
        self, namespace: bytes, keys: Sequence[bytes], role: str = Role.KV_COLD, *, lease_ms: int = 0
    ) -> int:
        """``lease_ms`` is accepted and ignored: this storage never evicts."""
        with self._lock:
            self.calls["lookup"] += 1
            space = self._space(namespace, role)
            return next((i for i, k in enumerate(keys) if k not in space), len(keys))

    def delete(self, namespace: bytes, keys: Sequence[bytes], role: str = Role.KV_COLD) -> int:
        with self._lock:
            self.calls["delete"] += 1
            space, tags = self._space(namespace, role), self._meta(namespace, role)
            for k in keys:
                tags.pop(k, None)
            return sum(space.pop(k, None) is not None for k in keys)

    def close(self) -> None:
        self.closed = True


class LazyStorage:
    """A :class:`Storage` that creates the real one from ``factory`` on first use and closes it once.

    For hooks that must not open connections before their engine forks its workers, and whose threads
    may all make the first call at the same moment: exactly one storage is created. After
    :meth:`close` the next call opens a fresh one.
    """

    def __init__(self, factory: Callable[[], Storage]) -> None:
        self._factory = factory
        self._storage: Storage | None = None
        self._lock = threading.Lock()

    def get(self) -> Storage:
        """The storage, created now if this is the first use."""
        with self._lock:
            if self._storage is None:
                self._storage = self._factory()
            return self._storage

    def put(
        self,
        namespace: bytes,
        items: Mapping[bytes, bytes],
        role: str = Role.KV_COLD,
        *,
        meta: Mapping[bytes, BlockMeta] | None = None,
    ) -> PutResult:
        return put_tagged(self.get(), namespace, items, role, meta)

    def get_buffers(
        self, namespace: bytes, keys: Sequence[bytes], role: str = Role.KV_COLD
    ) -> Sequence[Buffer | None]:
        return self.get().get_buffers(namespace, keys, role=role)

    def get_each(
        self, namespace: bytes, keys: Sequence[bytes], on_blob: BlobSink, role: str = Role.KV_COLD
    ) -> Sequence[int | None]:
        return self.get().get_each(namespace, keys, on_blob, role=role)

    def prefix_lookup(
        self, namespace: bytes, keys: Sequence[bytes], role: str = Role.KV_COLD, *, lease_ms: int = 0
    ) -> int:
        return self.get().prefix_lookup(namespace, keys, role=role, lease_ms=lease_ms)

    def delete(self, namespace: bytes, keys: Sequence[bytes], role: str = Role.KV_COLD) -> int:
        return self.get().delete(namespace, keys, role=role)

    def close(self) -> None:
        with self._lock:
            if self._storage is not None:
                self._storage.close()
                self._storage = None


__all__ = ["BlobSink", "LazyStorage", "MemoryStorage", "Storage", "open_cluster", "put_tagged"]
