"""``tierkv exo install / uninstall / status`` against a temporary site directory holding a fake EXO
(the stand-in cache module plus ``exo`` distribution metadata; the real EXO cannot be installed here).
Each check runs a fresh interpreter that adds the directory with ``site.addsitedir`` — as EXO's spawned
runners process their site-packages — and imports EXO's cache module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierkv.cli import app
from tierkv.connectors.exo.install import PTH_LINE, PTH_NAME

STANDIN = Path(__file__).with_name("standin.py")
PROBE = (
    "import site, sys; site.addsitedir(sys.argv[1]);"
    "import exo.worker.engines.mlx.cache as c;"
    "print(c.KVPrefixCache.__name__, getattr(c, '__tierkv_original__', None) is not None)"
)


def _fake_exo(site: Path, version: str) -> Path:
    package = site / "exo" / "worker" / "engines" / "mlx"
    package.mkdir(parents=True)
    for d in (package, *package.parents[:3]):
        (d / "__init__.py").write_text("")
    (package / "cache.py").write_text(STANDIN.read_text())
    meta = site / f"exo-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: exo\nVersion: {version}\n")
    return site


def _import_exo(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(site)], capture_output=True, text=True, timeout=120, check=True
    )


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["exo", *args])
    return result.exit_code, result.output


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return _fake_exo(tmp_path / "site", "0.3.68")


def test_install_patches_a_fresh_process_and_uninstall_undoes_it(site: Path) -> None:
    assert _import_exo(site).stdout.split() == ["KVPrefixCache", "False"]
    code, out = _cli("status", "--site-dir", str(site))
    assert code == 0 and "hook: not installed" in out and "guard: passes" in out

    code, out = _cli("install", "--site-dir", str(site))
    assert code == 0, out
    assert (site / PTH_NAME).read_text() == PTH_LINE
    assert _import_exo(site).stdout.split() == ["TieredKVPrefixCache", "True"]
    code, out = _cli("status", "--site-dir", str(site))
    assert code == 0 and "hook: installed" in out and "adapter active: True" in out

    before = sorted(p.relative_to(site) for p in site.rglob("*") if "__pycache__" not in p.parts)
    code, out = _cli("uninstall", "--site-dir", str(site))
    assert code == 0 and "removed" in out
    after = sorted(p.relative_to(site) for p in site.rglob("*") if "__pycache__" not in p.parts)
    assert set(before) - set(after) == {Path(PTH_NAME)}
    assert _import_exo(site).stdout.split() == ["KVPrefixCache", "False"]
    assert _cli("uninstall", "--site-dir", str(site)) == (0, "nothing to remove\n")


def test_mismatched_exo_is_left_untouched_with_a_message(tmp_path: Path) -> None:
    site = _fake_exo(tmp_path / "site", "0.4.1")
    assert _cli("install", "--site-dir", str(site))[0] == 0
    done = _import_exo(site)
    assert done.stdout.split() == ["KVPrefixCache", "False"]
    assert "tierkv EXO adapter not activated: exo version '0.4.1' is not supported" in done.stderr
    code, out = _cli("status", "--site-dir", str(site))
    assert code == 0
    assert "guard: refuses: exo version '0.4.1'" in out and "adapter active: False" in out


def test_foreign_pth_file_is_never_overwritten_or_removed(site: Path) -> None:
    (site / PTH_NAME).write_text("import something_else\n")
    code, out = _cli("install", "--site-dir", str(site))
    assert code == 2 and "not written by tierkv" in out
    code, out = _cli("uninstall", "--site-dir", str(site))
    assert code == 2 and "not written by tierkv" in out
    assert (site / PTH_NAME).read_text() == "import something_else\n"


def test_env_switch_turns_the_hook_off(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _cli("install", "--site-dir", str(site))[0] == 0
    monkeypatch.setenv("TIERKV_EXO", "off")
    assert _import_exo(site).stdout.split() == ["KVPrefixCache", "False"]
