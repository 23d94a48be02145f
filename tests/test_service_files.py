"""The service definitions we document: systemd unit and launchd plist carry what the README promises."""

from __future__ import annotations

import configparser
import plistlib
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_systemd_unit() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(ROOT / "systemd" / "tierkv-vault.service")
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert service["Restart"] == "on-failure"
    assert set(service["RestartPreventExitStatus"].split()) == {"2", "3", "4", "5"}
    assert service["StateDirectory"] == "tierkv"
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes"}.items():
        assert service[key] == value
    assert int(service["LimitNOFILE"]) >= 65536
    assert "tierkv vault" in service["ExecStart"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_launchd_plist() -> None:
    plist = plistlib.loads((ROOT / "launchd" / "io.tierkv.vault.plist").read_bytes())
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"Crashed": True}  # never restarted after an exit status (2-5 included)
    assert plist["ProgramArguments"][1] == "vault"
    assert plist["StandardOutPath"].endswith(".log") and plist["StandardErrorPath"].endswith(".log")


def test_the_units_and_the_example_config_are_package_data() -> None:
    data = ROOT / "tierkv" / "data"
    for shipped, documented in (
        ("tierkv-vault.service", ROOT / "systemd" / "tierkv-vault.service"),
        ("io.tierkv.vault.plist", ROOT / "launchd" / "io.tierkv.vault.plist"),
        ("tierkv.toml.example", ROOT / "tierkv.toml.example"),
    ):
        assert (data / shipped).read_text() == documented.read_text()
        assert documented.is_symlink(), "one copy of each file: the documented path links to the package data"


def test_the_sdist_carries_license_tests_proto_units_example_and_troubleshooting(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout")
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    src = tmp_path / "src"
    for name in listed.stdout.splitlines():
        if (ROOT / name).exists() or (ROOT / name).is_symlink():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name, follow_symlinks=False)
    build = f"from setuptools import build_meta as b; print(b.build_sdist({str(tmp_path / 'dist')!r}))"
    result = subprocess.run(
        [sys.executable, "-c", build], cwd=src, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    with tarfile.open(tmp_path / "dist" / result.stdout.strip().splitlines()[-1]) as sdist:
        members = {m.name.split("/", 1)[1]: m for m in sdist.getmembers() if "/" in m.name}
        expected = [
            "LICENSE",
            "TROUBLESHOOTING.md",
            "tests/conftest.py",
            "proto/tierkv/v1/vault.proto",
            "systemd/tierkv-vault.service",
            "launchd/io.tierkv.vault.plist",
            "tierkv.toml.example",
            "tierkv/data/tierkv.toml.example",
        ]
        for name in expected:
            assert name in members and members[name].isfile(), name
        pkg_info = sdist.extractfile(members["PKG-INFO"])
        assert pkg_info is not None
        meta = pkg_info.read().decode()
    assert "\nLicense: Apache-2.0\n" in meta and "Classifier: Typing :: Typed" in meta
    assert (
        "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    )
