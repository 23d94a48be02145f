"""data.mdb's size under churn, offline compaction and online backup (library and ``tierkv vault``)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import VaultFactory
from tierkv import VaultClient
from tierkv.vault.compact import backup, compact
from tierkv.vault.files import DATA_FILE, DirectoryInUse, VaultDirectoryError
from tierkv.vault.store import Store

BUDGET = 16 << 20


def churn(path: Path, *, overfill: int = 8, batch: int = 32, seed: int = 3) -> dict[bytes, bytes]:
    """Write ``overfill`` × the budget in batches of half the budget; returns what the store still holds."""
    rng = random.Random(seed)
    payload = os.urandom(1 << 20)
    written = 0
    with Store(path, BUDGET, sync_mode="fast") as s:
        while written < overfill * BUDGET:
            items = []
            for _ in range(batch):
                n = rng.randrange(4 << 10, 512 << 10)
                start = rng.randrange(len(payload) - n)
                items.append((f"k{written}".encode(), payload[start : start + n], 0))
                written += n
            s.put_many(b"ns", items)
            if rng.random() < 0.2:
                s.delete(b"ns", [k for k, _, _ in rng.sample(items, len(items) // 4)])
        return s.debug.blobs()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierkv", "vault", *args], capture_output=True, text=True, timeout=120
    )


def test_footprint_under_churn_stays_near_the_budget(tmp_path: Path) -> None:
    churn(tmp_path / "v")
    ratio = (tmp_path / "v" / DATA_FILE).stat().st_size / BUDGET
    assert ratio <= 1.4, f"data.mdb is {ratio:.2f} x max_bytes after churn in batches of half the budget"


def test_compact_shrinks_and_keeps_every_entry(tmp_path: Path) -> None:
    kept = churn(tmp_path / "v")
    with Store(tmp_path / "v", BUDGET) as s:
        s.flush()
        s.put_many(b"ns", [(b"survivor", b"s" * 100_000, 0)])
        used = s.stats().used_bytes
    result = compact(tmp_path / "v")
    assert result.after < result.before / 10
    assert result.after == (tmp_path / "v" / DATA_FILE).stat().st_size
    with Store(tmp_path / "v", BUDGET) as s:
        assert s.get_many(b"ns", [b"survivor"]) == [b"s" * 100_000]
        assert s.stats().used_bytes == used and s.stats().keys == 1
    assert kept, "the churn left entries behind"


def test_compact_keeps_every_entry_byte_for_byte(tmp_path: Path) -> None:
    kept = churn(tmp_path / "v", overfill=3)
    compact(tmp_path / "v")
    with Store(tmp_path / "v", BUDGET) as s:
        assert s.debug.blobs() == kept


def test_compact_refuses_while_a_vault_holds_the_directory(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    assert v.proc is not None
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"k": b"v" * 1000})
    before = (v.path / DATA_FILE).read_bytes()
    with pytest.raises(DirectoryInUse, match=f"PID {v.proc.pid}"):
        compact(v.path)
    done = cli("compact", str(v.path))
    assert done.returncode == DirectoryInUse.exit_code and "in use" in done.stderr
    assert "Traceback" not in done.stderr
    assert (v.path / DATA_FILE).read_bytes() == before
    with VaultClient(v.address) as c:
        assert c.get(b"ns", [b"k"]) == [b"v" * 1000]


def test_cli_compact_then_backup_of_a_running_vault(vault_factory: VaultFactory, tmp_path: Path) -> None:
    churn(tmp_path / "v", overfill=2)
    done = cli("compact", str(tmp_path / "v"))
    assert done.returncode == 0, done.stderr
    assert "compacted" in done.stdout
    v = vault_factory(name="v")
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"fresh": b"f" * 5000})
        done = cli("backup", str(v.path), str(tmp_path / "copy"))
        assert done.returncode == 0, done.stderr
        assert c.get(b"ns", [b"fresh"]) == [b"f" * 5000], "the vault serves on during the backup"
    again = vault_factory(name="copy")
    with VaultClient(again.address) as c:
        assert c.get(b"ns", [b"fresh"]) == [b"f" * 5000]
    assert cli("backup", str(v.path), str(tmp_path / "copy")).returncode != 0, "never over an existing store"


def test_nothing_to_compact_or_back_up_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(VaultDirectoryError, match="holds no vault store"):
        compact(tmp_path / "empty")
    with pytest.raises(VaultDirectoryError, match="holds no vault store"):
        backup(tmp_path / "empty", tmp_path / "dest")
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / DATA_FILE).write_bytes(b"\0" * 100)
    done = cli("backup", str(tmp_path / "v"), str(tmp_path / "dest"))
    assert done.returncode == 4 and "not an LMDB data file" in done.stderr
    assert not (tmp_path / "dest" / DATA_FILE).exists()
