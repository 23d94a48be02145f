"""A self-started vault (demo, bench, tests) runs the installed tierkv, whatever the working folder holds."""

from __future__ import annotations

from pathlib import Path

import pytest

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
