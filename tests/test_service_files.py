"""The service definitions we document: systemd unit and launchd plist carry what the README promises."""

from __future__ import annotations

import configparser
import plistlib
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_systemd_unit() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(ROOT / "systemd" / "tierkv-vault.service")
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert service["Restart"] == "on-failure"
    assert service["StateDirectory"] == "tierkv"
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes"}.items():
        assert service[key] == value
    assert int(service["LimitNOFILE"]) >= 65536
    assert "tierkv vault" in service["ExecStart"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_launchd_plist() -> None:
    plist = plistlib.loads((ROOT / "launchd" / "io.tierkv.vault.plist").read_bytes())
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ProgramArguments"][1] == "vault"
    assert plist["StandardOutPath"].endswith(".log") and plist["StandardErrorPath"].endswith(".log")
