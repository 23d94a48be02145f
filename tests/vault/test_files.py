"""The vault's data directory: damaged files are refused before LMDB maps them, one vault per directory,
private file modes, and a full disk that says so and recovers when keys are deleted."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import VaultFactory
from tierkv import VaultClient
from tierkv.errors import ResourceExhausted
from tierkv.vault.files import (
    DATA_FILE,
    DataFileDamaged,
    DirectoryInUse,
    VaultDirectory,
    VaultDirectoryError,
    data_file_problem,
)
from tierkv.vault.launcher import VaultProcess
from tierkv.vault.store import DiskFullError, Store, full_key

PAGE = 4096


def filled_store(path: Path, entries: int = 20) -> bytes:
    """A closed store holding ``entries`` blobs of 100 kB; returns data.mdb's bytes."""
    with Store(path, 64 << 20) as s:
        for i in range(entries):
            s.put_many(b"ns", [(f"k{i}".encode(), os.urandom(100_000), 0)])
    return (path / DATA_FILE).read_bytes()


def failed_start(proc: VaultProcess) -> tuple[int, str]:
    """Start a vault that must refuse to start; its exit status and its whole output."""
    with pytest.raises(RuntimeError, match="exited"):
        proc.start(timeout=30)
    assert proc.proc is not None
    return proc.proc.returncode, proc.log_file.read_text()


# -- item: a damaged data.mdb -------------------------------------------------------------------------------


def test_whole_file_passes_and_every_truncation_is_found(tmp_path: Path) -> None:
    whole = filled_store(tmp_path / "v")
    data_file = tmp_path / "v" / DATA_FILE
    assert data_file_problem(data_file) is None
    assert data_file_problem(tmp_path / "absent" / DATA_FILE) is None, "no file: a new store"
    for size in (0, 100, PAGE, 2 * PAGE, len(whole) // 2, len(whole) - PAGE, len(whole) - 1):
        data_file.write_bytes(whole[:size])
        assert data_file_problem(data_file) is not None, f"a file cut to {size} of {len(whole)} bytes"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3 * PAGE), st.integers(min_value=0, max_value=2 * PAGE))
def test_garbage_is_never_taken_for_a_store(
    tmp_path_factory: pytest.TempPathFactory, head: bytes, at: int
) -> None:
    data_file = tmp_path_factory.mktemp("garbage") / DATA_FILE
    data_file.write_bytes(head[:at] + b"\xde\xc0\xef\xbe" + head[at:])
    assert isinstance(data_file_problem(data_file), str)


def test_damaged_meta_page_is_found(tmp_path: Path) -> None:
    whole = bytearray(filled_store(tmp_path / "v"))
    whole[PAGE + 16] ^= 0xFF
    (tmp_path / "v" / DATA_FILE).write_bytes(whole)
    assert "second meta page" in str(data_file_problem(tmp_path / "v" / DATA_FILE))


def test_a_file_lmdb_itself_refuses_is_a_clear_error(tmp_path: Path) -> None:
    whole = bytearray(filled_store(tmp_path / "v"))
    for meta in (0, PAGE):
        whole[meta + 20] = 99  # the format version LMDB checks
    (tmp_path / "v" / DATA_FILE).write_bytes(whole)
    with pytest.raises(VaultDirectoryError, match="cannot open the LMDB store"):
        Store(tmp_path / "v", 1 << 20)
    with pytest.raises(VaultDirectoryError, match="not supported"):
        Store(tmp_path / "v", 1 << 20, on_damage="move-aside")
    assert (tmp_path / "v" / DATA_FILE).read_bytes() == whole, "another version's file is not damage"


@pytest.mark.parametrize("cut", ["half", "empty"])
def test_vault_refuses_a_truncated_data_file_with_one_clear_line(
    vault_factory: VaultFactory, tmp_path: Path, cut: str
) -> None:
    whole = filled_store(tmp_path / "v")
    (tmp_path / "v" / DATA_FILE).write_bytes(whole[: len(whole) // 2] if cut == "half" else b"")
    code, output = failed_start(vault_factory(name="v", start=False))
    assert code == DataFileDamaged.exit_code
    assert "Traceback" not in output
    assert str(tmp_path / "v" / DATA_FILE) in output
    assert ("truncated" if cut == "half" else "empty") in output
    assert "on_damage" in output, "the message says how to go on"


def set_meta_record(path: Path, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(path), max_dbs=4)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(key, value, db=meta)
    env.close()


@pytest.mark.parametrize("key", [b"used", b"count", b"clock", b"format"])
def test_a_damaged_totals_record_is_one_clear_line_not_a_traceback(
    vault_factory: VaultFactory, tmp_path: Path, key: bytes
) -> None:
    filled_store(tmp_path / "v", entries=2)
    set_meta_record(tmp_path / "v", key, b"\x01")
    code, output = failed_start(vault_factory(name="v", start=False))
    assert code == DataFileDamaged.exit_code, output
    assert "Traceback" not in output
    assert str(tmp_path / "v" / DATA_FILE) in output and repr(key.decode()) in output


def test_a_damaged_policy_record_only_reranks(vault_factory: VaultFactory, tmp_path: Path) -> None:
    filled_store(tmp_path / "v", entries=2)
    set_meta_record(tmp_path / "v", b"policy", b"\xff\xfe")
    v = vault_factory(name="v")
    with VaultClient(v.address) as c:
        assert c.stats().keys == 2 and c.get(b"ns", [b"k0"])[0] is not None
    assert v.stop() == 0 and "Traceback" not in v.log_tail(100)


def test_a_damaged_btree_page_is_a_clean_refusal_or_misses_never_a_traceback(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    """The header of each page that holds a key (its data, index and order records) overwritten in turn:
    a page the start reads (the index) crashed it with an lmdb traceback (exit 1). Each copy now starts
    and answers reads (a miss where LMDB cannot read) and stops cleanly (its recency write failed with
    a traceback and exit 1), or refuses with one line naming data.mdb."""
    base = vault_factory(name="base")
    with VaultClient(base.address) as c:
        c.put(b"ns", {f"k{i}".encode(): os.urandom(100) for i in range(50)})
    assert base.stop() == 0
    whole = (base.path / DATA_FILE).read_bytes()
    fkey = full_key(b"ns", b"k7")
    pages = sorted({i // PAGE for i in range(len(whole)) if whole.startswith(fkey, i)})
    assert len(pages) >= 2, pages
    refused = 0
    for page in pages:
        copy = tmp_path / f"page{page}"
        shutil.copytree(base.path, copy)
        damaged = bytearray(whole)
        damaged[page * PAGE : page * PAGE + 16] = b"\xee" * 16
        (copy / DATA_FILE).write_bytes(damaged)
        v = vault_factory(name=copy.name, start=False)
        try:
            v.start(timeout=30)
        except RuntimeError:
            assert v.proc is not None and v.proc.returncode == DataFileDamaged.exit_code, v.log_tail()
            assert "Traceback" not in v.log_tail(100) and "damaged page" in v.log_tail()
            refused += 1
            continue
        with VaultClient(v.address) as c:
            assert len(c.get(b"ns", [f"k{i}".encode() for i in range(50)])) == 50
        assert v.stop() == 0
        assert "Traceback" not in v.log_file.read_text() and "INTERNAL" not in v.log_file.read_text()
    assert refused, "no damaged page was one the start reads"


def test_move_aside_keeps_the_damaged_file_and_starts_empty(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    whole = filled_store(tmp_path / "v")
    (tmp_path / "v" / DATA_FILE).write_bytes(whole[: len(whole) // 2])
    config = tmp_path / "tierkv.toml"
    config.write_text('[vault]\non_damage = "move-aside"\n')
    v = vault_factory(name="v", extra_args=["-c", str(config)])
    with VaultClient(v.address) as c:
        assert c.stats().keys == 0
        assert c.put(b"ns", {b"k": b"fresh"}) == 1
        assert c.get(b"ns", [b"k"]) == [b"fresh"]
    aside = list((tmp_path / "v").glob(f"{DATA_FILE}.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == whole[: len(whole) // 2]
    assert "MOVED IT TO" in v.log_tail()


# -- item: one vault per directory --------------------------------------------------------------------------


def test_second_vault_on_one_directory_exits_naming_the_directory_and_holder(
    vault_factory: VaultFactory,
) -> None:
    first = vault_factory(name="shared")
    assert first.proc is not None
    code, output = failed_start(
        vault_factory(name="shared", start=False, log_file=first.path.parent / "second.log")
    )
    assert code == DirectoryInUse.exit_code
    assert "Traceback" not in output
    assert str(first.path) in output and f"PID {first.proc.pid}" in output
    with VaultClient(first.address) as c:
        assert c.put(b"ns", {b"k": b"v"}) == 1, "the first vault keeps serving"


def test_directory_lock_is_exclusive_in_one_process_and_released_on_close(tmp_path: Path) -> None:
    with Store(tmp_path / "v", 1 << 20):
        with pytest.raises(DirectoryInUse, match=str(tmp_path / "v")):
            Store(tmp_path / "v", 1 << 20)
    with Store(tmp_path / "v", 1 << 20) as s:
        assert s.stats().keys == 0


def test_a_refused_directory_is_left_unlocked(tmp_path: Path) -> None:
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / DATA_FILE).write_bytes(b"")
    with pytest.raises(DataFileDamaged):
        VaultDirectory(tmp_path / "v")
    VaultDirectory(tmp_path / "v", on_damage="move-aside").release()


# -- item: private files ------------------------------------------------------------------------------------


def test_data_files_and_directory_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with Store(tmp_path / "v", 1 << 20) as s:
            s.put_many(b"ns", [(b"k", b"v", 0)])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "v").stat().st_mode) == 0o700
    for name in (DATA_FILE, "lock.mdb", "tierkv.lock"):
        assert stat.S_IMODE((tmp_path / "v" / name).stat().st_mode) == 0o600, name


# -- item: a full disk --------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs mounted for this test only (needs root; skipped otherwise)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_full_disk_says_so_and_deletes_make_room(small_disk: Path) -> None:
    v = VaultProcess(small_disk / "v", max_bytes="256MiB", log_file=small_disk.parent / "v.log").start()
    try:
        with VaultClient(v.address) as c:
            stored: list[bytes] = []
            with pytest.raises(ResourceExhausted, match="disk full"):
                for i in range(40):
                    c.put(b"ns", {f"k{i}".encode(): os.urandom(1 << 20)})
                    stored.append(f"k{i}".encode())
            assert len(stored) >= 10
            assert c.delete(b"ns", stored[:4]) == 4
            assert c.put(b"ns", {b"after-delete": os.urandom(1 << 20)}) == 1, "a delete makes room at once"
            assert None not in c.get(b"ns", stored[-2:]), "reads keep working"
    finally:
        v.stop()


def test_on_a_full_disk_the_pages_a_delete_frees_serve_the_next_put(small_disk: Path) -> None:
    with Store(small_disk / "v", 256 << 20) as s:
        stored: list[bytes] = []
        with pytest.raises(DiskFullError, match="disk full"):
            for i in range(40):
                s.put_many(b"ns", [(f"k{i}".encode(), os.urandom(1 << 20), 0)])
                stored.append(f"k{i}".encode())
        assert s.delete(b"ns", stored[:2]) == 2
        assert s.put_many(b"ns", [(b"after-delete", b"a" * (1 << 20), 0)]).stored == 1
        assert s.get_many(b"ns", [b"after-delete"]) == [b"a" * (1 << 20)]


def test_budget_larger_than_the_disk_is_warned_at_start(small_disk: Path) -> None:
    v = VaultProcess(small_disk / "v", max_bytes="1GiB", log_file=small_disk.parent / "v.log").start()
    try:
        assert "Puts will fail with 'disk full' before the budget is reached" in v.log_tail()
    finally:
        v.stop()
    quiet = VaultProcess(small_disk / "q", max_bytes="8MiB", log_file=small_disk.parent / "q.log").start()
    quiet.stop()
    assert "disk full" not in quiet.log_tail()


def test_a_put_the_disk_fills_part_way_through_acknowledges_what_it_stored(small_disk: Path) -> None:
    """One Put of 40 MiB to a vault whose budget writes it in 16 MiB transactions, on a 24 MiB disk: the
    first transaction commits, a later one cannot. The reply says which blobs were stored, and exactly
    those are there (an error for the whole Put would say none were)."""
    v = VaultProcess(small_disk / "v", max_bytes="256MiB", log_file=small_disk.parent / "v.log").start()
    blobs = {f"k{i:02d}".encode(): os.urandom(1 << 20) for i in range(40)}
    try:
        with VaultClient(v.address, timeout=30, bulk=False) as c:
            ack = c.put_acks(b"ns", list(blobs.items()))
            assert ack.stored and ack.rejected, ack
            there = c.get(b"ns", list(blobs))
        stored = {i for i, blob in enumerate(there) if blob is not None}
        assert stored == set(ack.stored), (sorted(stored), ack)
        assert "disk full" in v.log_tail()
    finally:
        v.stop()
