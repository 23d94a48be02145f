"""Offline compaction and online backup of a vault's store, both LMDB compacting copies.

LMDB never gives pages back to the filesystem: ``data.mdb`` keeps the size of its fullest moment, and
pages freed by evictions are reused but stay on disk. A compacting copy writes only the live pages, in
key order, into a new file. :func:`compact` swaps that copy in place of ``data.mdb`` (an atomic rename,
so a crash leaves either the old file or the new one) and therefore needs the vault stopped: it takes the
directory's lock and refuses while a vault holds it. :func:`backup` only reads, in one read transaction,
so it is safe while the vault runs and copies a consistent snapshot.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

import lmdb

from tierkv.vault.files import (
    DATA_FILE,
    DIR_MODE,
    FILE_MODE,
    LMDB_LOCK_FILE,
    DataFileDamaged,
    VaultDirectory,
    VaultDirectoryError,
    data_file_problem,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CopyResult:
    """Sizes of ``data.mdb`` before and of the copy written."""

    source: Path
    target: Path
    before: int
    after: int


def compact(path: str | Path) -> CopyResult:
    """Rewrite ``path/data.mdb`` without its free pages; the vault on ``path`` must be stopped."""
    directory = Path(path)
    data_file = directory / DATA_FILE
    if not data_file.is_file():
        raise VaultDirectoryError(f"{data_file} does not exist: {directory} holds no vault store")
    hold = VaultDirectory(directory)
    try:
        before = data_file.stat().st_size
        work = Path(tempfile.mkdtemp(prefix=".compact-", dir=directory))
        try:
            copy = _compacting_copy(directory, work, mode=stat.S_IMODE(data_file.stat().st_mode))
            os.replace(copy, data_file)
            # the old file's reader table must not outlive it
            (directory / LMDB_LOCK_FILE).unlink(missing_ok=True)
            _fsync_dir(directory)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        after = data_file.stat().st_size
    finally:
        hold.release()
    log.info("compacted %s: %d -> %d bytes", data_file, before, after)
    return CopyResult(data_file, data_file, before, after)


def backup(path: str | Path, dest: str | Path) -> CopyResult:
    """Write a compacted copy of the store at ``path`` into the directory ``dest`` (a vault may run)."""
    source = Path(path)
    data_file = source / DATA_FILE
    if not data_file.is_file():
        raise VaultDirectoryError(f"{data_file} does not exist: {source} holds no vault store")
    problem = data_file_problem(data_file)
    if problem is not None:
        raise DataFileDamaged(f"{data_file}: {problem}; not backing it up")
    target = Path(dest)
    if (target / DATA_FILE).exists():
        raise VaultDirectoryError(f"{target / DATA_FILE} already exists; back up into a new directory")
    target.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    copy = _compacting_copy(source, target, mode=FILE_MODE)
    _fsync_dir(target)
    return CopyResult(data_file, copy, data_file.stat().st_size, copy.stat().st_size)


def _compacting_copy(source: Path, target: Path, *, mode: int) -> Path:
    """LMDB's compacting copy of ``source`` into ``target/data.mdb``, synced, with ``mode``."""
    copy = target / DATA_FILE
    try:
        env = lmdb.open(str(source), readonly=True, max_dbs=0, readahead=False)
        try:
            env.copy(str(target), compact=True)
        finally:
            env.close()
        os.chmod(copy, mode)
        with open(copy, "rb") as f:
            os.fsync(f.fileno())
    except (lmdb.Error, OSError) as exc:
        copy.unlink(missing_ok=True)
        raise VaultDirectoryError(
            f"copying {source / DATA_FILE} failed: {exc} (the original is unchanged)"
        ) from exc
    return copy


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
