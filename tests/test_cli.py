"""The ``tierkv`` command line as a user runs it: status over RPC, exit codes, config errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import VaultFactory
from tests.vault.test_daemon import free_port
from tierkv import VaultClient


def tierkv(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierkv", *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def cluster_toml(tmp_path: Path, kv_port: int, ssm_port: int) -> Path:
    path = tmp_path / "tierkv.toml"
    path.write_text(
        f'[cluster]\ntimeout = 1.0\n[cluster.kv_cold]\nhost = "127.0.0.1"\nport = {kv_port}\n'
        f'[cluster.ssm_cold]\nhost = "127.0.0.1"\nport = {ssm_port}\n'
    )
    return path


def test_status_reports_every_vault_over_rpc(vault_factory: VaultFactory, tmp_path: Path) -> None:
    kv = vault_factory(name="kv")
    ssm = vault_factory(name="ssm", role="ssm_cold")
    with VaultClient(kv.address) as c:
        c.put(b"ns", {b"a": b"x" * 100})
        c.get(b"ns", [b"a", b"b"])
    cfg = cluster_toml(tmp_path, kv.port, ssm.port)
    result = tierkv("status", "--config", str(cfg), "--json")
    assert result.returncode == 0, result.stderr
    nodes = {n["role"]: n for n in json.loads(result.stdout)["nodes"]}
    assert nodes["kv_cold"]["reachable"] and nodes["kv_cold"]["serving_role"] == "kv_cold"
    assert nodes["kv_cold"]["keys"] == 1 and nodes["kv_cold"]["hit_rate"] == 0.5
    assert nodes["kv_cold"]["used_bytes"] == 103 and nodes["kv_cold"]["max_bytes"] == 64 * 1024**2
    assert nodes["ssm_cold"]["serving_role"] == "ssm_cold" and nodes["ssm_cold"]["rtt_ms"] > 0
    table = tierkv("status", "--config", str(cfg))
    assert table.returncode == 0 and "kv_cold" in table.stdout and "50.0%" in table.stdout


def test_status_exits_nonzero_when_a_vault_is_unreachable(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    kv = vault_factory(name="kv")
    cfg = cluster_toml(tmp_path, kv.port, free_port())
    result = tierkv("status", "--config", str(cfg), "--json")
    assert result.returncode == 1
    nodes = {n["role"]: n for n in json.loads(result.stdout)["nodes"]}
    assert nodes["kv_cold"]["reachable"] and not nodes["ssm_cold"]["reachable"]
    assert "UNAVAILABLE" in nodes["ssm_cold"]["error"]
    table = tierkv("status", "--config", str(cfg))
    assert table.returncode == 1 and "unreachable" in table.stdout


def test_config_errors_name_file_and_key_on_the_command_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[vault]\nport = 'x'\n")
    result = tierkv("status", "--config", str(bad))
    assert result.returncode == 2
    assert str(bad) in result.stderr and "vault.port" in result.stderr and "integer" in result.stderr


def test_vault_flags_are_validated(tmp_path: Path) -> None:
    result = tierkv("vault", "--path", str(tmp_path / "v"), "--sync", "sometimes", "--port", "0")
    assert result.returncode == 2 and "vault.sync" in result.stderr


def test_version() -> None:
    result = tierkv("--version")
    assert result.returncode == 0 and result.stdout.startswith("tierkv ")
