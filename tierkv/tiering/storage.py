"""The one seam between the pipeline and the vaults: a small storage Protocol and its implementations.

Every engine hook reaches the cold tier through :class:`Storage` only. It has two declared parts:
:class:`Blocks` (put, get, lookup, delete: what every restore and store needs) and :class:`Hints` (what
the vaults can tell beyond the blocks: likely successors of a chain for prefetch, the hottest chains for
a warm start). Nothing reaches past it by probing for methods. Three things satisfy it:

- :class:`tierkv.client.cluster.Cluster` (structurally; :func:`open_cluster` builds one from tierkv.toml),
  the real thing: roles, sharding, replication, deadlines; it never raises because a vault failed;
- :class:`~tierkv.tiering.memory.MemoryStorage`, dicts in this process with faults a test switches on
  (down, slow, corrupt, evicting), for fast tests of the pipeline and of hooks;
- :class:`LazyStorage`, which opens another storage on first use (a hook that must not open sockets
  before its engine forks, or whose threads may all ask for it at once).

A put answers a :class:`~tierkv.records.PutResult`: how many blobs the vaults' replies said they stored, which
they refused and why, and which have fewer copies than asked; never what was merely sent.

``meta`` on a put is each block's retention metadata (:class:`~tierkv.retention.BlockMeta`), keyed like
``items``; a key without an entry (or ``meta=None``) is stored untagged, exactly as a store without a
layout always was. It travels with the blobs so every hook tags its blocks through this one path.

``role`` is a cold role name (``"kv_cold"`` / ``"ssm_cold"``; :class:`tierkv.roles.Role` members are
accepted as they are strings). Which role a blob goes to is decided once, by :func:`tierkv.roles.role_for`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from tierkv.codec import Buffer
from tierkv.config import Config
from tierkv.records import HotChain, PutResult, Successor
from tierkv.retention import BlockMeta
from tierkv.roles import Role

BlobSink = Callable[[int, Buffer], None]
"""``(index of the key, blob)`` for each blob a get finds, possibly on another thread while the rest of the
reply is still arriving; it must not raise, and the blob is valid only during the call."""


class Blocks(Protocol):
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
        self, namespace: bytes, keys: Sequence[bytes], role: str = ..., *, timeout: float | None = ...
    ) -> Sequence[Buffer | None]:
        """One blob (or ``None``) per key, in order, within ``timeout`` seconds (None: the storage's own
        deadline); what has not arrived by then is a miss."""
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


class Hints(Protocol):
    """What the vaults can say beyond the blocks they hold. Best effort: a failed or slow vault adds
    nothing, and a storage that knows nothing answers with nothing."""

    def successors(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        role: str = ...,
        *,
        max_bytes: int = ...,
        max_keys: int = ...,
        timeout: float | None = ...,
    ) -> Sequence[Successor]:
        """The blocks likely to be fetched after the chain ``keys``, best first, within ``max_bytes`` and
        ``max_keys`` (0: no bound of the caller's) and ``timeout`` seconds (None: the storage's own)."""
        ...

    def hottest(
        self, namespace: bytes, *, limit: int = ..., tenant: str = ..., role: str = ...
    ) -> Sequence[HotChain]:
        """The namespace's most-hit chains, hottest first, at most ``limit`` (0: the storage's default)."""
        ...


class Storage(Blocks, Hints, Protocol):
    """The whole contract between the pipeline and the vaults: blocks and hints."""


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
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        role: str = Role.KV_COLD,
        *,
        timeout: float | None = None,
    ) -> Sequence[Buffer | None]:
        return self.get().get_buffers(namespace, keys, role=role, timeout=timeout)

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

    def successors(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        role: str = Role.KV_COLD,
        *,
        max_bytes: int = 0,
        max_keys: int = 0,
        timeout: float | None = None,
    ) -> Sequence[Successor]:
        return self.get().successors(
            namespace, keys, role, max_bytes=max_bytes, max_keys=max_keys, timeout=timeout
        )

    def hottest(
        self, namespace: bytes, *, limit: int = 0, tenant: str = "", role: str = Role.KV_COLD
    ) -> Sequence[HotChain]:
        return self.get().hottest(namespace, limit=limit, tenant=tenant, role=role)

    def close(self) -> None:
        with self._lock:
            if self._storage is not None:
                self._storage.close()
                self._storage = None


__all__ = ["BlobSink", "Blocks", "Hints", "LazyStorage", "Storage", "open_cluster", "put_tagged"]
