"""The vault's hold on its data directory: one owner, files checked before they are mapped, disk space.

LMDB maps ``data.mdb`` into memory and trusts it: a file cut short (a full disk during a copy, a restore
that stopped half-way) is mapped beyond its end, and the first read of a missing page kills the process
with SIGBUS and no log line. So before LMDB sees the file, :func:`data_file_problem` reads LMDB's own two
meta pages and compares the last page they record with the file's length. A damaged file is refused with
:class:`DataFileDamaged` (exit status 4), or, when the operator set ``[vault] on_damage = "move-aside"``,
renamed out of the way (loudly) so the vault starts empty.

Two processes on one LMDB directory are legal for LMDB but not for the vault, whose byte accounting lives
in one process: :class:`VaultDirectory` takes an exclusive ``flock`` on ``tierkv.lock`` for as long as the
store is open, and a second vault fails with :class:`DirectoryInUse` (exit status 5) naming the holder.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import logging
import os
import struct
import time
from pathlib import Path
from typing import IO, Any, Literal

import lmdb

from tierkv.config import human_bytes
from tierkv.errors import TierKVError

log = logging.getLogger(__name__)

OnDamage = Literal["refuse", "move-aside"]
DATA_FILE = "data.mdb"
LMDB_LOCK_FILE = "lock.mdb"
LOCK_FILE = "tierkv.lock"
FILE_MODE = 0o600
DIR_MODE = 0o700
# data.mdb on disk per byte of budget under eviction churn while readers read (measured up to 1.41,
# see TROUBLESHOOTING.md "data.mdb is larger than max_bytes")
FOOTPRINT = 1.5

# LMDB's meta page (lmdb.h / mdb.c, 64-bit): a 16-byte page header (pgno u64, pad u16, flags u16, u32),
# then MDB_meta: magic u32, version u32, address u64, mapsize u64, two MDB_db of 48 bytes each (the page
# size lives in the first one's md_pad), last_pgno u64, txnid u64.
_META_MAGIC = 0xBEEFC0DE
_P_META = 0x08
_FLAGS = struct.Struct("<H")
_MAGIC = struct.Struct("<II")
_PAGE_SIZE = struct.Struct("<I")
_LAST = struct.Struct("<QQ")
_FLAGS_AT, _MAGIC_AT, _PAGE_SIZE_AT, _LAST_AT = 10, 16, 40, 136
_MAX_PAGE = 65536


class VaultDirectoryError(TierKVError):
    """The data directory cannot be used; ``exit_code`` is what ``tierkv vault`` exits with."""

    exit_code = 2


class DataFileDamaged(VaultDirectoryError):
    """``data.mdb`` is truncated, empty or not an LMDB file; mapping it could crash the process."""

    exit_code = 4


class DirectoryInUse(VaultDirectoryError):
    """Another process (normally another vault) holds the directory's lock."""

    exit_code = 5


@dataclasses.dataclass(frozen=True)
class _Meta:
    page_size: int
    last_page: int
    txnid: int


def _read_meta(head: bytes, offset: int) -> _Meta | None:
    if len(head) < offset + _LAST_AT + _LAST.size:
        return None
    (flags,) = _FLAGS.unpack_from(head, offset + _FLAGS_AT)
    magic, _version = _MAGIC.unpack_from(head, offset + _MAGIC_AT)
    (page_size,) = _PAGE_SIZE.unpack_from(head, offset + _PAGE_SIZE_AT)
    last_page, txnid = _LAST.unpack_from(head, offset + _LAST_AT)
    if not flags & _P_META or magic != _META_MAGIC:
        return None
    if page_size < 512 or page_size > _MAX_PAGE or page_size & (page_size - 1):
        return None
    return _Meta(page_size, last_page, txnid)


def data_file_problem(data_file: Path) -> str | None:
    """Why LMDB must not map ``data_file``, or None when it is whole (or absent: a new store)."""
    try:
        size = data_file.stat().st_size
        with data_file.open("rb") as f:
            head = f.read(2 * _MAX_PAGE)
    except FileNotFoundError:
        return None
    if size == 0:
        return "it is empty (0 bytes), so it holds no store at all"
    first = _read_meta(head, 0)
    if first is None:
        return f"it is not an LMDB data file ({size} bytes, no valid meta page at its start)"
    second = _read_meta(head, first.page_size)
    if second is None:
        return f"it is truncated or damaged ({size} bytes; the second meta page is missing or invalid)"
    current = max(first, second, key=lambda m: m.txnid)
    needed = (current.last_page + 1) * current.page_size
    if size < needed:
        return f"it is truncated: {size} bytes, but LMDB's metadata says its pages end at byte {needed}"
    return None


def _holder(lock_file: Path) -> str:
    try:
        pid = lock_file.read_text().strip()
    except OSError:
        return ""
    return f" (PID {pid})" if pid.isdigit() else ""


class VaultDirectory:
    """An LMDB directory owned by this process until :meth:`release`: locked, checked, created 0700/0600."""

    def __init__(self, path: str | Path, *, budget: int = 0, on_damage: OnDamage = "refuse") -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise VaultDirectoryError(f"cannot create the vault directory {self.path}: {exc}") from exc
        self.on_damage = on_damage
        self._lock_file: IO[str] | None = None
        self._lock()
        try:
            self._check(data_file_problem(self.path / DATA_FILE))
            if budget:
                warn_if_disk_small(self.path, budget)
        except BaseException:
            self.release()
            raise

    def _lock(self) -> None:
        lock_file = self.path / LOCK_FILE
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, FILE_MODE)
            handle = open(fd, "r+", encoding="ascii")  # noqa: SIM115 - held for the store's lifetime
        except OSError as exc:
            raise VaultDirectoryError(f"cannot open the lock file {lock_file}: {exc}") from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise VaultDirectoryError(f"cannot lock {lock_file}: {exc}") from exc
            raise DirectoryInUse(
                f"the vault directory {self.path} is in use by another process{_holder(lock_file)}; "
                "one directory serves one vault (give this one its own --path)"
            ) from exc
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock_file = handle

    def _check(self, problem: str | None) -> None:
        if problem is None:
            return
        data_file = self.path / DATA_FILE
        if self.on_damage != "move-aside":
            raise DataFileDamaged(
                f"{data_file}: {problem}; refusing to start (restore a backup, or set it aside and start "
                'empty with on_damage = "move-aside")'
            )
        aside = data_file.with_name(f"{DATA_FILE}.damaged-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        data_file.rename(aside)
        (self.path / LMDB_LOCK_FILE).unlink(missing_ok=True)
        log.error("%s: %s. MOVED IT TO %s AND STARTING WITH AN EMPTY STORE", data_file, problem, aside)

    def open_env(self, **options: Any) -> lmdb.Environment:
        """``lmdb.open`` with 0600 files; a file LMDB itself rejects is damage too (moved aside if asked)."""
        for _attempt in range(2):
            try:
                return lmdb.open(str(self.path), mode=FILE_MODE, **options)
            except (lmdb.InvalidError, lmdb.CorruptedError) as exc:
                self._check(f"LMDB rejects it ({exc})")
            except lmdb.MemoryError as exc:  # the map is reserved at once: address space, not disk or RAM
                raise VaultDirectoryError(
                    f"cannot open the LMDB store in {self.path}: its map of "
                    f"{human_bytes(options.get('map_size', 0))} (4 x max_bytes + 1 GiB) does not fit this "
                    "process's address space; lower max_bytes"
                ) from exc
            except lmdb.Error as exc:
                raise VaultDirectoryError(f"cannot open the LMDB store in {self.path}: {exc}") from exc
        raise DataFileDamaged(f"{self.path / DATA_FILE}: LMDB rejects it even after it was set aside")

    def release(self) -> None:
        """Give the directory up (the lock also goes with the process, or with this object). Idempotent."""
        handle, self._lock_file = self._lock_file, None
        if handle is not None:
            handle.close()


def free_disk_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def warn_if_disk_small(path: Path, budget: int) -> None:
    """Say at start-up, loudly, when the budget cannot fit on the disk (Puts would fail before it fills)."""
    try:
        data_size = (path / DATA_FILE).stat().st_size
    except FileNotFoundError:
        data_size = 0
    room = free_disk_bytes(path) + data_size
    needed = int(budget * FOOTPRINT)
    if needed > room:
        log.warning(
            "max_bytes %s needs about %s on disk, but %s has room for %s: Puts will fail "
            "with 'disk full' before the budget is reached; lower max_bytes or free disk space",
            human_bytes(budget),
            human_bytes(needed),
            path,
            human_bytes(room),
        )


def disk_full_message(path: Path, exc: lmdb.Error, wanted: int) -> str | None:
    """The 'disk full' explanation of a failed write, or None when the disk still has room.

    LMDB reports a short write as EIO ("Input/output error"), so the cause is read from the filesystem.
    """
    free = free_disk_bytes(path)
    if free >= wanted + 64 * _MAX_PAGE:
        return None
    return (
        f"disk full: {free} bytes free under {path}, a write of {wanted} bytes needs more ({exc}); "
        "free disk space, delete keys or lower max_bytes"
    )
