"""Token files as an operator writes them, carelessly or not: one parser reads them for ``tierkv vault``
and ``tierkv config check --vault``, refuses every problem in one line ``file:line: problem`` (exit 2, no
traceback, the token never echoed), and never lets a file start a vault with less auth than it says.
Every check runs the real command line (``config check`` in process, for speed, the rest as processes);
the vault ones start real vault processes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import grpc
import pytest
from typer.testing import CliRunner

from tests.conftest import VaultFactory
from tests.vault.rawcalls import bulk_records, code_of, stats, unary
from tierkv import VaultClient
from tierkv.cli import app
from tierkv.limits import MAX_AUTH_TOKEN_BYTES
from tierkv.vault.launcher import TIERKV_COMMAND
from tierkv.wire import SERVICE, bulk, pb

SECRET = "s3cr3t-never-printed"

BAD_FILES: list[tuple[str, bytes, int, str]] = [
    # (what, file bytes, line named (0: the file), words the problem must say)
    ("only comments", b"# tok-a alpha user\n\n   \n# tok-b beta user\n", 0, "names no token"),
    ("empty", b"", 0, "names no token"),
    ("a wrapped line", f"{SECRET} alpha user\n20GiB\n".encode(), 2, "a bare token is valid only as"),
    ("a bare token first", f"{SECRET}\ntok-b beta user\n".encode(), 1, "a bare token is valid only as"),
    ("two bare tokens", f"{SECRET}\ntok-b\n".encode(), 2, "a second bare token"),
    ("two fields", f"{SECRET} alpha\n".encode(), 1, "got 2 fields"),
    ("five fields", f"{SECRET} alpha user 1GiB extra\n".encode(), 1, "got 5 fields"),
    ("an unknown role", f"{SECRET} alpha root\n".encode(), 1, "admin or user, not 'root'"),
    ("a bad quota", f"{SECRET} alpha user 20GX\n".encode(), 1, "not a byte size"),
    ("a zero quota", f"{SECRET} alpha user 0\n".encode(), 1, "must be positive"),
    ("a duplicate token", f"# x\n{SECRET} alpha user\n{SECRET} beta user\n".encode(), 3, "also on line 2"),
    ("two quotas", f"{SECRET} alpha user 1GiB\ntok-b alpha user 2GiB\n".encode(), 2, "1GiB on line 1"),
    ("a bad tenant name", f"{SECRET} al/pha user\n".encode(), 1, "tenant name 'al/pha'"),
    ("a long tenant name", f"{SECRET} {'t' * 65} user\n".encode(), 1, "must be 1-64"),
    (
        "65 tenants",
        "".join(f"tok-{i} tenant{i} user\n" for i in range(64)).encode(),
        64,
        "at most 64 tenants",
    ),
    ("not UTF-8", f"{SECRET} alpha user\ntok-b \xff\xfe user\n".encode("latin-1"), 2, "not UTF-8"),
    ("a token over the limit", b"x" * (MAX_AUTH_TOKEN_BYTES + 1) + b" alpha user\n", 1, "limit is 4096"),
    ("a bare token over the limit", b"x" * (MAX_AUTH_TOKEN_BYTES + 1) + b"\n", 1, "limit is 4096"),
    ("a non-ASCII token", "tök-a alpha user\n".encode(), 1, "printable ASCII"),
]


VAULT_CASES = ("only comments", "a wrapped line", "65 tenants", "not UTF-8", "a token over the limit")
"""Cases the vault itself is started with (the parser is the same; these once started it open or crashed)."""


def tierkv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TIERKV_COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "TIERKV_TOKEN": "", **(env or {})},
    )


def config_for(tmp_path: Path, content: bytes, mode: int = 0o600) -> tuple[Path, Path]:
    tokens = tmp_path / "tokens"
    tokens.write_bytes(content)
    tokens.chmod(mode)
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text(f'[auth]\ntoken_file = "{tokens}"\n[vault]\npath = "{tmp_path / "data"}"\nport = 0\n')
    return cfg, tokens


def client_config(tmp_path: Path, port: int, auth: str) -> Path:
    cfg = tmp_path / "client.toml"
    cfg.write_text(f'[cluster.kv_cold]\nhost = "127.0.0.1"\nport = {port}\n[auth]\n{auth}\n')
    return cfg


def assert_one_line(result: subprocess.CompletedProcess[str], tokens: Path, line: int, words: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output and SECRET not in output, output
    assert len(output.strip().splitlines()) == 1, output
    where = f"{tokens}:{line}: " if line else f"{tokens}: "
    assert where in output and words in output, output


@pytest.mark.parametrize(("what", "content", "line", "words"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_config_check_refuses_each_problem_in_one_line(
    tmp_path: Path, what: str, content: bytes, line: int, words: str
) -> None:
    cfg, tokens = config_for(tmp_path, content)
    result = CliRunner().invoke(app, ["config", "check", "--vault", "-c", str(cfg)], env={"TIERKV_TOKEN": ""})
    assert isinstance(result.exception, SystemExit), result.exception  # a clean exit, not a traceback
    done = subprocess.CompletedProcess(["tierkv"], result.exit_code, result.stdout, result.stderr)
    assert_one_line(done, tokens, line, words)


@pytest.mark.parametrize(
    ("what", "content", "line", "words"),
    [c for c in BAD_FILES if c[0] in VAULT_CASES],
    ids=[c[0] for c in BAD_FILES if c[0] in VAULT_CASES],
)
def test_the_vault_refuses_to_start_with_the_same_line(
    tmp_path: Path, what: str, content: bytes, line: int, words: str
) -> None:
    cfg, tokens = config_for(tmp_path, content)
    assert_one_line(tierkv("vault", "-c", str(cfg)), tokens, line, words)
    assert not (tmp_path / "data" / "data.mdb").exists()


def test_a_good_file_passes_config_check_and_says_what_auth_is(tmp_path: Path) -> None:
    cfg, _ = config_for(
        tmp_path, f"# rotated: old token removed\n{SECRET} alpha user 1GiB\nt2-{SECRET} ops admin\n".encode()
    )
    result = tierkv("config", "check", "--vault", "-c", str(cfg))
    assert result.returncode == 0, result.stderr
    assert "auth is on: 2 token(s), 2 tenant(s)" in result.stdout and result.stderr == ""


def test_config_check_says_plainly_when_auth_is_off(tmp_path: Path) -> None:
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text(f'[vault]\npath = "{tmp_path / "data"}"\nport = 0\n')
    result = tierkv("config", "check", "--vault", "-c", str(cfg))
    assert result.returncode == 0, result.stderr
    assert "auth is OFF" in result.stdout and "admin of tenant 'default'" in result.stdout


def test_a_readable_token_file_is_warned_about(tmp_path: Path, vault_factory: VaultFactory) -> None:
    cfg, tokens = config_for(tmp_path, f"{SECRET} alpha user\n".encode(), mode=0o644)
    result = tierkv("config", "check", "--vault", "-c", str(cfg))
    assert result.returncode == 0
    assert (
        f"chmod 600 {tokens}" in result.stderr and "open to its group and others (mode 0644)" in result.stderr
    )
    v = vault_factory(extra_args=["--config", str(cfg)])
    assert "open to its group and others (mode 0644)" in v.log_tail()
    client = tierkv("config", "check", "-c", str(cfg))
    assert "mode 0644" in client.stderr, "a client's token file is a secret too"
    tokens.chmod(0o600)
    assert "chmod" not in tierkv("config", "check", "--vault", "-c", str(cfg)).stderr


def test_a_vault_without_auth_says_so_at_start_and_in_status(
    tmp_path: Path, vault_factory: VaultFactory
) -> None:
    v = vault_factory(env={"TIERKV_TOKEN": ""})
    assert "auth is OFF" in v.log_tail()
    cfg = tmp_path / "client.toml"
    cfg.write_text(
        f'[cluster.kv_cold]\nhost = "127.0.0.1"\nport = {v.port}\n[auth]\ntoken_env = "MY_TOKEN"\n'
    )
    for token in ("", "any-token-at-all"):  # the vault answers both, so either way it is open
        result = tierkv("status", "-c", str(cfg), "--json", env={"MY_TOKEN": token})
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["nodes"][0]["auth"] == "off"
    table = tierkv("status", "-c", str(cfg))
    assert "auth OFF" in table.stdout and "auth is OFF" in table.stderr


def test_status_says_auth_is_on_when_a_tokenless_call_is_refused(
    tmp_path: Path, vault_factory: VaultFactory
) -> None:
    vcfg, _ = config_for(tmp_path, f"{SECRET} alpha user\n".encode())
    v = vault_factory(extra_args=["--config", str(vcfg)])
    assert "auth is OFF" not in v.log_tail()
    token = tmp_path / "client-token"
    token.write_text(SECRET + "\n")
    token.chmod(0o600)
    cfg = tmp_path / "client.toml"
    cfg.write_text(
        f'[cluster.kv_cold]\nhost = "127.0.0.1"\nport = {v.port}\n[auth]\ntoken_file = "{token}"\n'
    )
    result = tierkv("status", "-c", str(cfg), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["nodes"][0]["auth"] == "on"


def test_grpc_wants_the_bearer_scheme_and_bulk_the_bare_token(
    tmp_path: Path, vault_factory: VaultFactory
) -> None:
    cfg, _ = config_for(tmp_path, f"{SECRET} alpha user\n".encode())
    v = vault_factory(extra_args=["--config", str(cfg)])
    stats_call = f"/{SERVICE}/Stats"
    with grpc.insecure_channel(v.address) as ch:
        assert stats(ch, SECRET).tenant == "alpha"
        call = ch.unary_unary(stats_call, lambda b: b, lambda b: b)
        for header in (SECRET, f"Token {SECRET}", f"Bearer{SECRET}"):
            with pytest.raises(grpc.RpcError) as refused:
                call(b"", timeout=10, metadata=[("authorization", header)])
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED, header
        assert (
            pb.StatsReply.FromString(
                call(b"", timeout=10, metadata=[("authorization", f"bearer {SECRET}")])
            ).tenant
            == "alpha"
        )
        port = stats(ch, SECRET).bulk_port
        assert code_of(unary, ch, "Stats", b"", None) is grpc.StatusCode.UNAUTHENTICATED
    lookup = pb.PrefixLookupRequest(namespace=b"ns", keys=[b"k"]).SerializeToString()
    good = bulk_records(port, bulk.encode_request(SECRET, lookup, bulk.OP_PREFIX_LOOKUP))
    assert good[-1] == (bulk.END, b"")
    [(kind, payload)] = bulk_records(
        port, bulk.encode_request(f"Bearer {SECRET}", lookup, bulk.OP_PREFIX_LOOKUP)
    )
    assert kind == bulk.ERROR and bulk.parse_error(payload)[0] == "UNAUTHENTICATED"


def test_a_token_at_the_limit_works_on_both_transports(tmp_path: Path, vault_factory: VaultFactory) -> None:
    longest = "k" * MAX_AUTH_TOKEN_BYTES
    cfg, _ = config_for(tmp_path, f"{longest} alpha user\n".encode())
    v = vault_factory(extra_args=["--config", str(cfg)])
    with VaultClient(v.address, token=longest, timeout=10) as c:
        assert c.put(b"ns", {b"k": b"v" * 1000}) == 1
        assert c.get(b"ns", [b"k"]) == [b"v" * 1000]
        assert c.bulk_port is not None  # the bulk port served it; nothing fell back
        assert c.stats().tenant == "alpha"
    with pytest.raises(ValueError, match="at most 4096"):
        VaultClient(v.address, token=longest + "k")


def test_the_environment_token_is_held_to_the_same_limit(tmp_path: Path) -> None:
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text(f'[vault]\npath = "{tmp_path / "data"}"\nport = 0\n')
    result = tierkv("config", "check", "--vault", "-c", str(cfg), env={"TIERKV_TOKEN": "e" * 4097})
    assert result.returncode == 2 and "$TIERKV_TOKEN" in result.stderr and "limit is 4096" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_guessable_token_is_warned_about_with_its_line(tmp_path: Path, vault_factory: VaultFactory) -> None:
    """Nothing held a token to any length: a two-character token was taken without a word."""
    cfg, tokens = config_for(tmp_path, f"# ops\n{SECRET} ops admin\nQz alpha user\n".encode())
    result = tierkv("config", "check", "--vault", "-c", str(cfg))
    assert result.returncode == 0, result.stderr
    assert f"{tokens}:3: a token of 2 bytes is guessable" in result.stderr
    assert ":2:" not in result.stderr, "a long token is not warned about"
    v = vault_factory(extra_args=["--config", str(cfg)])
    warned = [line for line in v.log_tail().splitlines() if "is guessable" in line]
    assert len(warned) == 1 and f"{tokens}:3:" in warned[0] and "Qz" not in warned[0]
    env = vault_factory(name="env", env={"TIERKV_TOKEN": "short"})
    assert "$TIERKV_TOKEN: a token of 5 bytes is guessable" in env.log_tail()


@pytest.mark.parametrize("kind", ["device", "fifo", "huge"])
def test_a_token_file_that_is_no_file_is_one_clear_line(tmp_path: Path, kind: str) -> None:
    """/dev/zero was read until memory ran out (a MemoryError traceback) and a FIFO blocked the start
    forever; a token file must be a regular file of at most 1 MiB, on both sides."""
    from tests.test_cli import assert_clean_error

    if kind == "device":
        path = Path("/dev/zero")
    elif kind == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    else:
        path = tmp_path / "huge"
        path.write_bytes(f"{SECRET}\n".encode() + b"#" * (2 << 20))
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text(f'[auth]\ntoken_file = "{path}"\n[vault]\npath = "{tmp_path / "v"}"\nport = 0\n')
    for args in (
        ("vault", "-c", str(cfg)),
        ("config", "check", "--vault", "-c", str(cfg)),
        ("status", "-c", str(cfg)),
    ):
        assert_clean_error(tierkv(*args), "auth.token_file", str(path))
