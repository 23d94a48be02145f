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


# -- hostile and careless targets: one line, exit 2, nothing written through a link ---------------------


def _fake_python(tmp_path: Path, answer: str) -> Path:
    """An "interpreter" that answers the probe with ``answer`` whatever it is asked."""
    exe = tmp_path / "fake-python"
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer}\nEOF\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ('{"python": "x", "tierkv": ""}', "no site-packages directory (purelib: None)"),
        ('{"purelib": 5, "tierkv": ""}', "no site-packages directory (purelib: 5)"),
        ('{"purelib": "", "tierkv": ""}', "no site-packages directory (purelib: '')"),
        ('{"purelib": "/no/such/site-packages", "tierkv": ""}', "is not an existing directory"),
        ('["purelib", "/tmp"]', "answered the probe with list"),
        ("not json at all", "did not answer the probe"),
    ],
    ids=["no purelib", "wrong type", "empty", "missing directory", "a list", "no json"],
)
def test_a_bad_site_answer_is_one_line_and_exit_2(tmp_path: Path, answer: str, words: str) -> None:
    exe = _fake_python(tmp_path, answer)
    for action in ("install", "status", "uninstall"):
        code, out = _cli(action, "--python", str(exe))
        assert code == 2 and words in out and "Traceback" not in out, (action, out)
        assert len(out.strip().splitlines()) == 1, out


def test_an_empty_python_is_an_error(site: Path) -> None:
    for action in ("install", "status", "uninstall"):
        code, out = _cli(action, "--python", "", "--site-dir", str(site))
        assert code == 2 and "--python is empty" in out, out
    assert not (site / PTH_NAME).exists()


@pytest.mark.parametrize("dangling", [True, False], ids=["dangling", "to a file"])
def test_a_link_in_the_way_is_never_written_through(site: Path, tmp_path: Path, dangling: bool) -> None:
    target = tmp_path / "elsewhere" / "victim"
    target.parent.mkdir()
    if not dangling:
        target.write_text("precious\n")
    (site / PTH_NAME).symlink_to(target)
    code, out = _cli("install", "--site-dir", str(site))
    assert code == 2 and "symbolic link" in out, out
    assert (site / PTH_NAME).is_symlink()
    assert (not target.exists()) if dangling else target.read_text() == "precious\n"
    code, out = _cli("uninstall", "--site-dir", str(site))
    assert code == 2 and "symbolic link" in out and (site / PTH_NAME).is_symlink(), out
    assert "hook: not installed" in _cli("status", "--site-dir", str(site))[1]


def test_install_leaves_no_temporary_file_and_a_readable_pth(site: Path) -> None:
    assert _cli("install", "--site-dir", str(site))[0] == 0
    assert _cli("install", "--site-dir", str(site))[0] == 0, "installing twice rewrites our own file"
    assert [p.name for p in site.iterdir() if p.name.startswith(".tierkv")] == []
    assert (site / PTH_NAME).stat().st_mode & 0o777 == 0o644


def test_a_missing_site_dir_is_one_line(tmp_path: Path) -> None:
    code, out = _cli("install", "--site-dir", str(tmp_path / "absent"))
    assert code == 2 and "is not an existing directory" in out and "Traceback" not in out, out
