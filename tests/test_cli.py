"""The ``tierkv`` command line as a user runs it: status over RPC, exit codes, config errors."""

from __future__ import annotations

import dataclasses
import fcntl
import importlib.util
import json
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from tests.conftest import VaultFactory
from tests.ports import refusing_port
from tierkv import VaultClient, cli
from tierkv.config import Config, load_config
from tierkv.extras import MissingExtra, require


def tierkv(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the command line; ``input`` is its stdin (None: no stdin at all)."""
    return subprocess.run(
        [sys.executable, "-m", "tierkv", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
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
        c.prefix_lookup(b"ns", [b"a"], lease_ms=10_000)
    cfg = cluster_toml(tmp_path, kv.port, ssm.port)
    result = tierkv("status", "--config", str(cfg), "--json")
    assert result.returncode == 0, result.stderr
    nodes = {n["role"]: n for n in json.loads(result.stdout)["nodes"]}
    leases = nodes["kv_cold"]["leases"]
    assert (leases["granted"], leases["held"], leases["leased_bytes"]) == (1, 1, 103)
    assert nodes["kv_cold"]["reachable"] and nodes["kv_cold"]["serving_role"] == "kv_cold"
    assert nodes["kv_cold"]["keys"] == 1 and nodes["kv_cold"]["hit_rate"] == 0.5
    assert nodes["kv_cold"]["used_bytes"] == 103 and nodes["kv_cold"]["max_bytes"] == 64 * 1024**2
    assert (nodes["kv_cold"]["tenant"], nodes["kv_cold"]["access"]) == ("default", "admin")
    assert (
        nodes["kv_cold"]["bulk_port"] > 0 and nodes["kv_cold"]["bulk_put"] and nodes["kv_cold"]["bulk_lookup"]
    )
    assert nodes["ssm_cold"]["serving_role"] == "ssm_cold" and nodes["ssm_cold"]["rtt_ms"] > 0
    table = tierkv("status", "--config", str(cfg))
    assert table.returncode == 0 and "kv_cold" in table.stdout and "50.0%" in table.stdout


def test_status_exits_nonzero_when_a_vault_is_unreachable(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    kv = vault_factory(name="kv")
    with refusing_port() as nothing:
        cfg = cluster_toml(tmp_path, kv.port, nothing)
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


PLAIN_VAULT_LINES = [
    ["vault"],
    ["vault", "--port", "0", "--path", "/srv/v", "-v", "--verbose"],
    [
        "vault",
        *("-c", "a.toml", "--host", "::1", "--port", "0042", "--path", "", "--max-bytes", "1GiB"),
        *("--sync", "fast", "--policy", "lru", "--role", "ssm_cold", "--metrics-port", "9100"),
        *("--on-damage", "move-aside", "--ready-file", "r", "-v"),
    ],
    ["vault", "--config", "a.toml", "--role", "inference"],  # a bad role is the vault's error, not a flag's
]


@pytest.mark.parametrize("args", PLAIN_VAULT_LINES, ids=range(len(PLAIN_VAULT_LINES)))
def test_a_plain_vault_command_line_is_parsed_as_typer_parses_it(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tierkv vault` parses a plain command line itself (a vault starts without building the app): the
    vault gets exactly the values typer's parsing gives it."""
    seen: list[dict[str, object]] = []
    monkeypatch.setattr(cli, "serve_vault", lambda **flags: seen.append(flags))
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0 and len(seen) == 1, result.output
    by_typer = {name: value for name, value in seen[0].items() if value is not None}
    assert cli.plain_vault_flags(args) == by_typer


@pytest.mark.parametrize(
    "args",
    [
        ["vault", "--help"],
        ["vault", "compact", "/srv/v"],
        ["vault", "--port=1"],
        ["vault", "--port", "1", "--port", "2"],
        ["vault", "-c", "a.toml", "--config", "b.toml"],
        ["vault", "--port", "x1"],
        ["vault", "--port", "-1"],
        ["vault", "--port", "\u0663"],  # a digit, but not one typer is asked about here
        ["vault", "--port", "1" * 10],
        ["vault", "--path", "--port"],
        ["vault", "--port"],
        ["vault", "-vv"],
        ["vault", "--bogus", "1"],
        ["vault", "--", "--port", "1"],
        ["--version"],
        ["status"],
        [],
    ],
)
def test_anything_but_a_plain_vault_command_line_is_left_to_typer(args: list[str]) -> None:
    assert cli.plain_vault_flags(args) is None


def test_every_vault_option_is_one_the_plain_parser_knows() -> None:
    """A new `tierkv vault` option would still work (typer parses what the plain parser does not know),
    but every vault would then start through typer again."""
    vault = typer.main.get_command(cli.app).commands["vault"]  # type: ignore[attr-defined]
    options = {o for p in vault.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
    assert options == set(cli.VAULT_OPTIONS) | set(cli.VERBOSE_FLAGS)


def test_version() -> None:
    result = tierkv("--version")
    assert result.returncode == 0 and result.stdout.startswith("tierkv ")


# -- one clear line and exit 2 instead of a traceback ----------------------------------------------------


def assert_clean_error(result: subprocess.CompletedProcess[str], *needles: str, code: int = 2) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == code, output
    assert "Traceback" not in output, output
    for needle in needles:
        assert needle in output, output


def vault_args(tmp_path: Path, *extra: str) -> tuple[str, ...]:
    return ("vault", "--port", "0", "--path", str(tmp_path / "v"), *extra)


def test_a_missing_token_file_names_the_file_and_the_section(tmp_path: Path) -> None:
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text(f'[auth]\ntoken_file = "{tmp_path / "token"}"\n')
    for args in (vault_args(tmp_path, "-c", str(cfg)), ("status", "-c", str(cfg))):
        result = tierkv(*args)
        assert_clean_error(result, str(cfg), "auth.token_file", str(tmp_path / "token"), "No such file")


def test_missing_tls_files_are_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text(f'[tls]\ncert_file = "{tmp_path / "c.pem"}"\nkey_file = "{tmp_path / "k.pem"}"\n')
    assert_clean_error(
        tierkv(*vault_args(tmp_path, "-c", str(cfg))), "tls.cert_file", str(tmp_path / "c.pem")
    )


def test_a_taken_metrics_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = tierkv(*vault_args(tmp_path, "--metrics-port", port))
    assert_clean_error(result, "vault.metrics_port", f"port {port}", "taken")


def test_a_taken_vault_port_is_one_line_and_exit_3(tmp_path: Path) -> None:
    """Only tierkv's line: not gRPC's core log, its advice about GRPC_VERBOSITY, or a "vault stopped" for a
    vault that never served."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = tierkv("vault", "--port", port, "--path", str(tmp_path / "v"))
    assert_clean_error(result, f"127.0.0.1:{port}", "Address already in use", "--port", code=3)
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot bind"), lines


def test_a_budget_whose_map_does_not_fit_the_address_space_says_so(tmp_path: Path) -> None:
    """LMDB reserves 4 x max_bytes + 1 GiB of address space at once; where that does not fit (here: a
    16 GiB address-space limit against a 17 GiB map) the error says which setting to lower."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))

    result = subprocess.run(
        [sys.executable, "-m", "tierkv", *vault_args(tmp_path, "--max-bytes", "4GiB")],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        preexec_fn=limit,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output
    assert (
        "its map of 17.0 GiB (4 x max_bytes + 1 GiB) does not fit" in output and "lower max_bytes" in output
    )


def test_bad_paths_and_addresses_on_the_command_line_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cases = [
        (("vault", "--port", "0", "--path", str(tmp_path / "file" / "v")), ("vault.path", "cannot create")),
        (
            ("vault", "--port", "0", "--path", str(tmp_path / "file")),
            ("vault.path", "exists and is not a directory"),
        ),
        (
            vault_args(tmp_path, "--ready-file", str(tmp_path / "no" / "r")),
            ("--ready-file", "does not exist"),
        ),
        (vault_args(tmp_path, "--host", "no-such-host.invalid"), ("vault.host", "cannot resolve")),
        (vault_args(tmp_path, "--host", "192.0.2.1"), ("vault.host", "not an address of this machine")),
        (vault_args(tmp_path, "-c", str(tmp_path)), ("--config", "is a directory")),
        (vault_args(tmp_path, "--role", "inference"), ("--role", "kv_cold or ssm_cold")),
        (("status", "-c", str(tmp_path)), ("--config", "is a directory")),
        (("demo", "--tokens", "0", "--state-dir", str(tmp_path / "d")), ("--tokens", "at least one block")),
    ]
    for args, needles in cases:
        assert_clean_error(tierkv(*args), *needles)


def test_a_missing_extra_names_the_pip_install() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; "
        "sys.argv = ['tierkv', 'bench', 'hf', '--tokens', '64', '--repeats', '1']; "
        "from tierkv.cli import run; run()"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert_clean_error(result, "needs torch", "pip install 'tierkv[hf]'")


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtra, match=r"tierkv\.connectors\.hf needs torch.*pip install 'tierkv\[hf\]'"):
        require("torch", "tierkv.connectors.hf")
    assert require("json", "x").dumps([]) == "[]"


# -- status ------------------------------------------------------------------------------------------------


def test_status_points_at_the_files_own_vault_when_no_cluster_entry_names_it(tmp_path: Path) -> None:
    """A first tierkv.toml often moves [vault] off 50051 and leaves [cluster] (or its default) behind."""
    cfg = tmp_path / "tierkv.toml"
    with refusing_port() as asked, refusing_port() as served:
        cfg.write_text(
            f"[cluster]\ntimeout = 1.0\n[cluster.kv_cold]\nport = {asked}\n[vault]\nport = {served}\n"
        )
        result = tierkv("status", "-c", str(cfg))
        assert result.returncode == 1, result.stderr
        assert f"its [vault] serves on port {served}, which no [cluster] vault has" in result.stderr
        assert f"127.0.0.1:{asked}" in result.stderr and "[cluster.kv_cold]" in result.stderr
        cfg.write_text(
            f"[cluster]\ntimeout = 1.0\n[cluster.kv_cold]\nport = {served}\n[vault]\nport = {served}\n"
        )
        result = tierkv("status", "-c", str(cfg))
        assert result.returncode == 1 and "hint" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("status", "--timeout", "0"),
        ("status", "--timeout", "-1"),
        ("admin", "namespaces", "--timeout", "0"),
        ("snapshot", "--timeout", "-2"),
        ("pages", "--timeout", "0"),
    ],
)
def test_a_deadline_of_zero_or_less_is_refused_before_any_vault_is_asked(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Not every vault shown unreachable ("no answer within the deadline"), and not 0 read as "unset"."""
    result = tierkv(*args, cwd=tmp_path)
    assert_clean_error(result, "--timeout", "expected a positive number of seconds")
    assert "unreachable" not in result.stdout + result.stderr and not list(tmp_path.iterdir())


def test_status_tells_a_refused_token_from_an_unreachable_vault(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    kv = vault_factory(name="kv", env={"TIERKV_TOKEN": "right"})
    with refusing_port() as nothing:
        cfg = cluster_toml(tmp_path, kv.port, nothing)
        cfg.write_text(cfg.read_text() + '[auth]\ntoken_env = "MY_TOKEN"\n')
        result = tierkv("status", "--config", str(cfg), "--json", env={"MY_TOKEN": "wrong"})
        assert result.returncode == 1
        nodes = {n["role"]: n for n in json.loads(result.stdout)["nodes"]}
        assert nodes["kv_cold"]["state"] == "auth refused" and nodes["ssm_cold"]["state"] == "unreachable"
        table = tierkv("status", "--config", str(cfg), env={"MY_TOKEN": "wrong"})
        assert "auth refused" in table.stdout and "unreachable" in table.stdout
        assert "the token from $MY_TOKEN is not one that vault accepts" in table.stderr, table.stderr
        none = tierkv("status", "--config", str(cfg), env={"MY_TOKEN": ""})
        assert f"this side sent no token: set [auth] token_file in {cfg}, or $MY_TOKEN" in none.stderr
        right = tierkv("status", "--config", str(cfg), "--json", env={"MY_TOKEN": "right"})
    assert {n["role"]: n["state"] for n in json.loads(right.stdout)["nodes"]}["kv_cold"] == "ok"


def test_status_watch_refreshes_until_its_count(vault_factory: VaultFactory, tmp_path: Path) -> None:
    kv = vault_factory(name="kv")
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text(f'[cluster.kv_cold]\nhost = "127.0.0.1"\nport = {kv.port}\n')
    result = tierkv("status", "-c", str(cfg), "--json", "--watch", "0.1", "--count", "3")
    assert result.returncode == 0, result.stderr
    rounds = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rounds) == 3 and rounds[0]["time"] < rounds[2]["time"]
    assert all(r["nodes"][0]["state"] == "ok" for r in rounds)


def test_status_watch_stops_on_ctrl_c(vault_factory: VaultFactory, tmp_path: Path) -> None:
    kv = vault_factory(name="kv")
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text(f'[cluster.kv_cold]\nhost = "127.0.0.1"\nport = {kv.port}\n')
    cmd = [sys.executable, "-m", "tierkv", "status", "-c", str(cfg), "--json", "--watch", "0.2"]
    # Ctrl-C as a terminal delivers it: a suite started in the background (``make test &``) inherits an
    # ignored SIGINT, which Python then keeps ignoring, so the child gets the default disposition back.
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    ) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _out, errors = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in errors
    assert json.loads(first)["nodes"][0]["state"] == "ok"


# -- config and service commands -------------------------------------------------------------------------


def test_config_check_exits_0_or_2(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[[cluster.kv_cold]]\nhost = "a"\nport = 1\n')
    result = tierkv("config", "check", "-c", str(good))
    assert result.returncode == 0 and "ok" in result.stdout and "1 kv_cold" in result.stdout
    dup = tmp_path / "dup.toml"
    dup.write_text('[[cluster.kv_cold]]\nhost = "a"\nport = 1\n[[cluster.kv_cold]]\nhost = "a"\nport = 1\n')
    assert_clean_error(tierkv("config", "check", "-c", str(dup)), "cluster.kv_cold[1]", "listed twice")
    taken = tmp_path / "vault.toml"
    taken.write_text(f'[vault]\npath = "{tmp_path / "file" / "v"}"\n')
    (tmp_path / "file").write_text("")
    assert tierkv("config", "check", "-c", str(taken)).returncode == 0
    assert_clean_error(
        tierkv("config", "check", "--vault", "-c", str(taken)), "vault.path", "not a directory"
    )


def test_the_01_config_is_accepted_and_its_log_file_honoured(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    log_file = tmp_path / "tierkv.log"
    old = tmp_path / "old.toml"
    old.write_text(
        '[cluster]\nrole = "kv_cold"\n[cluster.kv_cold]\nhost = "127.0.0.1"\nport = 1\n'
        '[cluster.recompute]\nhost = "127.0.0.1"\nport = 2\n'
        f'[inference]\nexo_path = "/opt/exo"\nlog_file = "{log_file}"\nmemory_threshold = 0.9\nkv_dim = 128\n'
    )
    check = tierkv("config", "check", "-c", str(old))
    assert check.returncode == 0, check.stderr
    for key in ("cluster.recompute", "inference.exo_path", "inference.log_file", "inference.kv_dim"):
        assert check.stderr.count(f"{key}: obsolete") == 1, check.stderr
    assert "[log] file" in check.stderr
    vp = vault_factory(name="old", extra_args=["-c", str(old)])
    vp.stop()
    assert "vault serving on" in log_file.read_text()


def test_config_show_prints_the_effective_config(tmp_path: Path) -> None:
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text('[vault]\nmax_bytes = "2GiB"\n[cluster.ssm_cold]\nhost = "::1"\nport = 7\n')
    shown = tierkv("config", "show", "-c", str(cfg))
    assert shown.returncode == 0
    copy = tmp_path / "copy.toml"
    copy.write_text(shown.stdout)
    assert load_config(copy) == dataclasses.replace(load_config(cfg), source=str(copy))
    assert "max_bytes = 2147483648" in shown.stdout and "grace_s = 5.0" in shown.stdout
    doc = json.loads(tierkv("config", "show", "-c", str(cfg), "--json").stdout)
    assert doc["source"] == str(cfg) and doc["cluster"]["ssm_cold"] == [{"host": "::1", "port": 7}]


def test_config_init_writes_the_example_and_does_not_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "tierkv.toml"
    assert tierkv("config", "init", str(target)).returncode == 0
    assert load_config(target).vault == Config().vault
    assert target.read_text() == (Path(__file__).parent.parent / "tierkv.toml.example").read_text()
    assert_clean_error(tierkv("config", "init", str(target)), "exists", "--force")
    assert tierkv("config", "init", str(target), "--force").returncode == 0
    assert tierkv("config", "init", "-").stdout == target.read_text()


def test_config_init_creates_missing_directories(tmp_path: Path) -> None:
    target = tmp_path / "etc" / "tierkv" / "tierkv.toml"
    assert tierkv("config", "init", str(target)).returncode == 0
    assert load_config(target).vault == Config().vault


def test_service_print_gives_the_shipped_units_for_this_install(tmp_path: Path) -> None:
    root = Path(__file__).parent.parent
    shipped = tierkv("service", "print", "systemd", "--exec", "/opt/tierkv/bin/tierkv")
    assert shipped.returncode == 0
    assert shipped.stdout == (root / "systemd" / "tierkv-vault.service").read_text()
    here = tierkv("service", "print", "systemd", "--user", "kv").stdout
    assert f"ExecStart={Path(sys.executable).parent / 'tierkv'} vault" in here
    assert "User=kv\nGroup=kv\n" in here and "/opt/tierkv" not in here
    launchd = tierkv("service", "print", "launchd", env={"HOME": str(tmp_path)}).stdout
    assert "/Users/YOU" not in launchd and f"{tmp_path}/Library/Logs/tierkv/vault.log" in launchd
    assert tierkv("service", "print", "upstart").returncode == 2


# -- help --------------------------------------------------------------------------------------------------


def test_help_shows_h_defaults_the_token_variable_and_flags_without_placeholders() -> None:
    top = tierkv("-h")
    assert top.returncode == 0 and "TIERKV_TOKEN" in top.stdout and "config" in top.stdout
    status = tierkv("status", "-h")
    assert status.returncode == 0 and "TIERKV_TOKEN" in status.stdout
    assert "<bool>" not in status.stdout and "--json " in status.stdout
    assert (
        "-v, --verbose  " in status.stdout
        and "<int>" not in status.stdout.split("--verbose")[1].split("\n")[0]
    )
    vault = tierkv("vault", "-h")
    assert (
        "(default 8GiB)" in vault.stdout
        and "(default durable)" in vault.stdout
        and "TIERKV_TOKEN" in vault.stdout
    )
    assert tierkv("config", "show", "-h").returncode == 0


def test_the_01_install_command_names_its_successor() -> None:
    result = tierkv("install", "--exo-path", "/opt/exo")
    assert_clean_error(result, "tierkv exo install --python /opt/exo/.venv/bin/python")
    commands = [
        line.split()[0]
        for line in tierkv("--help").stdout.split("Commands:")[1].splitlines()
        if line.startswith("  ")
    ]
    assert "exo" in commands and "install" not in commands


@pytest.mark.parametrize(
    ("command", "engine", "extra", "engine_flag"),
    [
        ("mlx-serve", "mlx_lm", "mlx", "--prompt-cache-size"),
        ("llama-serve", "llama_cpp", "llamacpp", "--n_ctx"),
    ],
)
def test_a_server_launcher_names_its_extra_and_its_help_lists_both_flag_sets(
    command: str, engine: str, extra: str, engine_flag: str
) -> None:
    """``--help`` of a launcher shows tierkv's ``--tierkv-*`` flags and then the engine's own; without the
    engine installed it names the extra to install."""
    if importlib.util.find_spec(engine) is None:
        assert_clean_error(tierkv(command, "--model", "m"), f"pip install 'tierkv[{extra}]'")
        assert_clean_error(tierkv(command, "--help"), f"pip install 'tierkv[{extra}]'")
        return
    out = tierkv(command, "--help").stdout
    assert "--tierkv-config PATH" in out and "--tierkv-block-size N" in out and engine_flag in out


def test_the_start_line_is_said_once(vault_factory: VaultFactory) -> None:
    """The vault logs its start line at INFO on stderr; it is not printed to stdout a second time."""
    v = vault_factory()
    v.stop()
    assert v.log_file.read_text().count("vault serving on") == 1, v.log_tail()
    assert "budget 64MiB," in v.log_file.read_text(), "the budget as tierkv.toml spells it, not in bytes"


def test_a_vault_creates_its_data_directory_0700(tmp_path: Path) -> None:
    data, ready = tmp_path / "new" / "vault", tmp_path / "ready"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tierkv",
            "vault",
            "--port",
            "0",
            "--path",
            str(data),
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the vault did not start"
            time.sleep(0.05)
        assert data.stat().st_mode & 0o777 == 0o700
    finally:
        proc.terminate()
        proc.wait(30)


def in_a_terminal(args: list[str], columns: int) -> str:
    """Run the command line on a pseudo-terminal ``columns`` wide; its screen output, colours removed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierkv", *args], stdin=slave, stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer exited
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        proc.wait(60)
    return re.sub(r"\x1b\[[0-9;]*m", "", b"".join(chunks).decode())


def test_status_reads_at_80_columns_in_a_terminal(vault_factory: VaultFactory, tmp_path: Path) -> None:
    v = vault_factory()
    host, port = v.address.rsplit(":", 1)
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text(f'[cluster.kv_cold]\nhost = "{host}"\nport = {port}\n')
    screen = in_a_terminal(["status", "-c", str(cfg)], 80)
    lines = screen.replace("\r", "").splitlines()
    table = [line for line in lines if line[:1] in "┏┃┡│└"]  # prose lines below it wrap in the terminal
    assert table and max(len(line) for line in table) <= 80, screen
    row = next(line for line in lines if "kv_cold" in line)
    assert v.address in row and "│ ok" in row and "…" not in screen, screen


def test_reading_kv_events_needs_the_light_routing_extra_not_vllm() -> None:
    from tierkv.extras import install_hint

    assert install_hint("zmq") == install_hint("msgspec") == "pip install 'tierkv[routing]'"
    assert install_hint("vllm") == "pip install 'tierkv[vllm]'"
