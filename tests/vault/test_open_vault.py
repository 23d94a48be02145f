"""A vault with no token answers anyone who reaches it, so it listens on loopback only unless the operator
says the network is trusted (``[auth] allow_open``, or ``$TIERKV_ALLOW_OPEN`` for a vault a script starts):
a missing token file fails closed, in one line naming ``vault.host``, before the vault binds or creates
anything. The refusals run the real command line as processes; the accepted cases build the vault without
starting it, so no test listens beyond loopback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tierkv.config import load_config
from tierkv.config.preflight import check_vault_start
from tierkv.errors import ConfigError
from tierkv.vault.auth import ALLOW_OPEN_ENV, is_loopback
from tierkv.vault.launcher import TIERKV_COMMAND
from tierkv.vault.server import VaultServer

GOOD_TOKEN = "9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f"


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.3.2.1", "127.1", "::1", "[::1]", "localhost", "LocalHost"]
)
def test_loopback_addresses_and_names_are_loopback(host: str) -> None:
    assert is_loopback(host) is True


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "*", "0", "10.0.0.5", "192.168.1.7", "fe80::1%eth0"])
def test_any_other_address_is_reachable(host: str) -> None:
    """``*`` and ``0`` too: a bind resolves them to every interface."""
    assert is_loopback(host) is False


def test_a_name_that_does_not_resolve_is_left_to_the_start_s_own_check() -> None:
    assert is_loopback("no-such-host.invalid") is None


def _env(**extra: str) -> dict[str, str]:
    """This environment without a token or the opt-in, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("TIERKV_TOKEN", ALLOW_OPEN_ENV, "TIERKV_CONFIG")}
    return {**env, **extra}


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TIERKV_COMMAND, *args], capture_output=True, text=True, timeout=30, env=env, cwd=cwd, check=False
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "*"])
def test_an_open_vault_beyond_loopback_refuses_to_start_in_one_line(tmp_path: Path, host: str) -> None:
    """The data path is a file, which the start's next check refuses: a vault that skipped this one fails
    on that instead of listening on ``host``."""
    data = tmp_path / "a-file"
    data.write_text("")
    args = ["vault", "--host", host, "--port", "0", "--path", str(data), "-c", "/dev/null"]
    done = _run(args, _env(), tmp_path)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "vault.host" in lines[0] and host in lines[0] and "allow_open" in lines[0], lines[0]


def test_the_rule_is_asked_before_the_data_directory_is_made(tmp_path: Path) -> None:
    path = tmp_path / "tierkv.toml"
    path.write_text(f'[vault]\nhost = "0.0.0.0"\nport = 50999\npath = "{tmp_path / "v"}"\n')

    def refuse() -> None:
        raise ConfigError(str(path), "vault.host", "refused")

    with pytest.raises(ConfigError, match="refused"):
        check_vault_start(load_config(path), before_disk=refuse)
    assert not (tmp_path / "v").exists(), "refused, yet it made the data directory"
    check_vault_start(load_config(path), before_disk=lambda: None)
    assert (tmp_path / "v").is_dir()


def test_config_check_refuses_it_too_and_the_opt_ins_pass(tmp_path: Path) -> None:
    base = f'[vault]\nhost = "0.0.0.0"\nport = 50999\npath = "{tmp_path / "v"}"\n'
    refused = tmp_path / "refused.toml"
    refused.write_text(base)
    done = _run(["config", "check", "--vault", "-c", str(refused)], _env(), tmp_path)
    assert done.returncode == 2 and "vault.host" in done.stderr and "Traceback" not in done.stderr, done
    allowed = tmp_path / "allowed.toml"
    allowed.write_text(base + "[auth]\nallow_open = true\n")
    done = _run(["config", "check", "--vault", "-c", str(allowed)], _env(), tmp_path)
    assert done.returncode == 0, done
    assert "auth is OFF" in done.stdout + done.stderr  # still said, as at every open start
    done = _run(["config", "check", "--vault", "-c", str(refused)], _env(**{ALLOW_OPEN_ENV: "1"}), tmp_path)
    assert done.returncode == 0, done


@pytest.mark.parametrize(
    ("extra", "env"),
    [
        ("", {"TIERKV_TOKEN": GOOD_TOKEN}),  # auth on: the address is the operator's business
        ("[auth]\nallow_open = true\n", {}),
        ("", {ALLOW_OPEN_ENV: "1"}),
    ],
)
def test_a_token_or_an_opt_in_lets_it_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str, env: dict[str, str]
) -> None:
    for name in ("TIERKV_TOKEN", ALLOW_OPEN_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "tierkv.toml"
    # built, not started, and no bulk port (the one thing the constructor binds): nothing listens
    path.write_text(
        f'[vault]\nhost = "0.0.0.0"\nport = 50999\nbulk = false\npath = "{tmp_path / "v"}"\n{extra}'
    )
    server = VaultServer(load_config(path))
    try:
        assert server.authenticated == ("TIERKV_TOKEN" in env)
    finally:
        server._abandon()


def test_the_opt_in_takes_only_a_yes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERKV_TOKEN", raising=False)
    monkeypatch.setenv(ALLOW_OPEN_ENV, "0")
    path = tmp_path / "tierkv.toml"
    path.write_text(f'[vault]\nhost = "0.0.0.0"\nport = 50999\nbulk = false\npath = "{tmp_path / "v"}"\n')
    with pytest.raises(ConfigError, match=r"vault\.host"):
        VaultServer(load_config(path))
