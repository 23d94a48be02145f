"""A self-started vault (demo, bench, tests) runs the installed tierkv, whatever the working folder holds,
and starts without importing what serving does not use."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import VaultFactory
from tierkv.client.vault import VaultClient
from tierkv.vault.launcher import VaultProcess


@pytest.mark.parametrize("decoy", ["state folder", "package"])
def test_a_tierkv_folder_in_the_working_directory_is_not_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoy: str
) -> None:
    monkeypatch.chdir(tmp_path)
    if decoy == "package":  # something else called tierkv, importable from here
        (tmp_path / "tierkv").mkdir()
        (tmp_path / "tierkv" / "__init__.py").write_text("raise SystemExit('imported the wrong tierkv')\n")
    # else: `--state-dir tierkv`, the way a user names the demo's directory: an empty folder first
    vault = VaultProcess(Path("tierkv") / "kv_cold", max_bytes="16MiB")
    try:
        vault.start(timeout=60)
        with VaultClient(vault.address) as client:
            client.put(b"ns", {b"k": b"v"})
            assert client.get(b"ns", [b"k"]) == [b"v"]
    finally:
        assert vault.stop() == 0, vault.log_tail()


NOT_AT_START = ("numpy", "rich", "pydantic")
"""Modules a vault loads only when a call needs them: numpy for the first bulk Put's buffer, rich for an
error line; pydantic only when typer parses an unusual command line. Most of a vault's start is imports,
and the test suite starts some three hundred vaults."""


def test_a_vault_starts_without_the_modules_only_some_calls_need(vault_factory: VaultFactory) -> None:
    # Python's own import log (-X importtime) of a real vault process, through its start and shutdown
    vault = vault_factory(env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert vault.stop() == 0, vault.log_tail()
    lines = vault.log_file.read_text().splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    assert {"tierkv.cli", "tierkv.vault.server", "grpc", "lmdb"} <= imported  # the log is the vault's
    loaded = sorted({m.split(".")[0] for m in imported} & set(NOT_AT_START))
    assert not loaded, f"a vault start imported {loaded}"
