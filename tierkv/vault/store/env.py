"""The LMDB environment under a store: opening it, the locks around it, map growth and a full disk.

Writers are serialised by one lock; every transaction (read or write) holds the shared side of
:class:`SharedExclusive`, and growing the map takes the exclusive side, because LMDB forbids resizing
while any transaction is open. The map starts at its cap (address space, not disk), so growth is rare.
A write that finds the disk full gets one retry after a tiny commit has made the pages freed two
transactions before reusable.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from tierkv.vault.files import OnDamage, VaultDirectory, disk_full_message
from tierkv.vault.store.format import CLOCK_KEY, META, check_format, put_u64

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
MAX_TENANTS = 64
MAP_GROWTHS = 6
"""A write that finds the map full grows it (doubling) at most this many times before giving up."""
T = TypeVar("T")


class StoreFullError(Exception):
    """The store could not make room (map cannot grow and eviction freed too little, or disk full)."""


class DiskFullError(StoreFullError):
    """The filesystem under the store has no room for a write (LMDB reports it as an I/O error)."""


class SharedExclusive:
    """Many transactions at once, or one map resize alone (LMDB forbids resizing under open txns).

    A waiting resize holds back new transactions (so a stream of readers cannot starve it), and readers
    in the middle of a long reply look at :attr:`exclusive_waiting` to end their transaction early.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @property
    def exclusive_waiting(self) -> bool:
        return self._waiting > 0

    def acquire_shared(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1

    def release_shared(self) -> None:
        with self._cond:
            self._shared -= 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        self.acquire_shared()
        try:
            yield
        finally:
            self.release_shared()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class StoreEnv:
    """One locked data directory, its LMDB environment and the locks every transaction takes."""

    def __init__(
        self,
        path: Path,
        max_bytes: int,
        *,
        durable: bool,
        map_size: int | None,
        max_map_size: int | None,
        on_damage: OnDamage,
    ) -> None:
        self.path = path
        # locked for this process and checked before LMDB maps the file (files.py says why)
        self._directory = VaultDirectory(path, budget=max_bytes, on_damage=on_damage)
        self.max_map_size = max_map_size or _round_up(4 * max_bytes + 1024 * _MIB, _MIB)
        # The map starts at its cap: it is address space, not disk, and growing it later would have to
        # wait for every open read transaction while holding the write lock.
        self.env: Any = self._directory.open_env(
            map_size=map_size or self.max_map_size,
            max_dbs=1 + 5 * MAX_TENANTS,
            sync=durable,
            metasync=durable,
            max_readers=256,
            readahead=False,
        )
        self.meta = self.env.open_db(META)
        with self.env.begin(write=True) as txn:
            check_format(txn, self.meta, str(path))
        self.write_lock = threading.Lock()
        self.rw = SharedExclusive()

    def open_db(self, name: bytes) -> Any:
        return self.env.open_db(name)

    @contextlib.contextmanager
    def read(self, *, buffers: bool = True) -> Iterator[lmdb.Transaction]:
        """A read transaction under the shared lock."""
        with self.rw.shared(), self.env.begin(buffers=buffers) as txn:
            yield txn

    @contextlib.contextmanager
    def write(self) -> Iterator[lmdb.Transaction]:
        """The write lock, then a write transaction under the shared lock (for maintenance and deletes;
        Puts go through :meth:`write_retrying`)."""
        with self.write_lock, self.rw.shared(), self.env.begin(write=True) as txn:
            yield txn

    def write_retrying(self, attempt: Callable[[], T], *, wanted: Callable[[], int], clock: int) -> T:
        """``attempt()`` (which opens its own write transaction, the caller holding the write lock),
        growing a full map and retrying a full disk once; lmdb errors become :class:`StoreFullError`
        (``wanted()``, the bytes the write needed, only then goes into the message)."""
        retried_disk = False
        for _ in range(MAP_GROWTHS):
            try:
                with self.rw.shared():
                    return attempt()
            except lmdb.MapFullError:
                self._grow_map()
            except lmdb.Error as exc:
                full = disk_full_message(self.path, exc, wanted())
                if full is None:
                    raise StoreFullError(f"LMDB write failed: {exc}") from exc
                if retried_disk:
                    raise DiskFullError(full) from exc
                retried_disk = True
                self._release_freed_pages(clock)
        raise StoreFullError("LMDB map is full and cannot grow further")

    def _release_freed_pages(self, clock: int) -> None:
        """Commit one tiny transaction: pages that transaction N freed (deletes, evictions) are reusable
        from transaction N+2 on, so on a full disk this lets the next write use them."""
        with contextlib.suppress(lmdb.Error), self.rw.shared(), self.env.begin(write=True) as txn:
            put_u64(txn, self.meta, CLOCK_KEY, clock)

    def _grow_map(self) -> None:
        current = self.env.info()["map_size"]
        if current >= self.max_map_size:
            raise StoreFullError(
                f"LMDB map at its cap of {self.max_map_size} bytes; free space on disk or lower max_bytes"
            )
        new = min(self.max_map_size, current * 2)
        with self.rw.exclusive():
            self.env.set_mapsize(new)
        log.info("grew LMDB map from %d to %d bytes", current, new)

    @property
    def map_size(self) -> int:
        return int(self.env.info()["map_size"])

    def sync(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        try:
            self.env.close()
        finally:
            self._directory.release()


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


__all__ = ["MAX_TENANTS", "DiskFullError", "SharedExclusive", "StoreEnv", "StoreFullError"]
