"""tierkv.toml: search order, the 0.1 seed format, arrays of vaults, and errors that name file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierkv.config import Config, config_from_dict, load_config, parse_size, with_overrides
from tierkv.errors import ConfigError

SEED = """
[cluster]
role = "inference"

[cluster.kv_cold]
host = "10.0.0.2"
port = 50051

[cluster.ssm_cold]
host = "10.0.0.3"
port = 50052

[vault]
port = 50051
"""


def write(tmp_path: Path, text: str, name: str = "tierkv.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_seed_format_stays_valid(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, SEED))
    assert [e.address for e in cfg.cluster.kv_cold] == ["10.0.0.2:50051"]
    assert [e.address for e in cfg.cluster.ssm_cold] == ["10.0.0.3:50052"]
    assert cfg.vault.port == 50051 and cfg.source.endswith("tierkv.toml")


def test_a_role_may_list_several_vaults(tmp_path: Path) -> None:
    text = '[[cluster.kv_cold]]\nhost = "a"\nport = 1\n[[cluster.kv_cold]]\nhost = "b"\nport = 2\n'
    cfg = load_config(write(tmp_path, text))
    assert [e.address for e in cfg.cluster.kv_cold] == ["a:1", "b:2"]


def test_example_file_parses_to_the_defaults() -> None:
    example = Path(__file__).parent.parent / "tierkv.toml.example"
    cfg = load_config(example)
    assert cfg.vault == Config().vault and cfg.cluster == Config().cluster and cfg.auth == Config().auth


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("[vault]\nprot = 1\n", "vault.prot", "unknown key"),
        ('[vault]\nport = "fifty"\n', "vault.port", "expected an integer, got string 'fifty'"),
        ("[vault]\nport = 70000\n", "vault.port", "expected a port number"),
        ('[vault]\nmax_bytes = "lots"\n', "vault.max_bytes", "not a byte size"),
        ('[vault]\nsync = "sometimes"\n', "vault.sync", "expected one of 'durable', 'fast'"),
        ("[cluster]\ntimeout = -1\n", "cluster.timeout", "positive"),
        ('[cluster]\nrole = "gpu"\n', "cluster.role", "expected one of"),
        ("[cluster.kv_cold]\nport = true\n", "cluster.kv_cold[0].port", "expected an integer"),
        ("vault = 3\n", "vault", "expected a table"),
        ("[[cluster.kv_cold]]\nhots = 'x'\n", "cluster.kv_cold[0].hots", "unknown key"),
        ("[vault\n", "<file>", "not valid TOML"),
    ],
)
def test_errors_name_the_file_the_key_and_what_was_expected(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.source == str(path)
    assert info.value.key == key
    assert expected in info.value.problem
    assert str(path) in str(info.value) and key in str(info.value)


def test_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".config" / "tierkv").mkdir(parents=True)
    write(home / ".config" / "tierkv", "[vault]\nport = 1001\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.delenv("TIERKV_CONFIG", raising=False)
    assert load_config().vault.port == 1001
    write(work, "[vault]\nport = 1002\n")
    assert load_config().vault.port == 1002
    env_file = write(tmp_path, "[vault]\nport = 1003\n", "env.toml")
    monkeypatch.setenv("TIERKV_CONFIG", str(env_file))
    assert load_config().vault.port == 1003
    explicit = write(tmp_path, "[vault]\nport = 1004\n", "explicit.toml")
    assert load_config(explicit).vault.port == 1004


def test_built_in_defaults_when_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIERKV_CONFIG", raising=False)
    cfg = load_config()
    assert cfg.source == "<built-in defaults>"
    assert (cfg.vault.host, cfg.vault.port) == ("127.0.0.1", 50051)


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_flags_override_and_are_validated() -> None:
    cfg = with_overrides(Config(), "vault", port=0, max_bytes="2GiB", host=None)
    assert cfg.vault.port == 0 and cfg.vault.max_bytes == 2 * 1024**3 and cfg.vault.host == "127.0.0.1"
    with pytest.raises(ConfigError) as info:
        with_overrides(Config(), "vault", sync="maybe")
    assert info.value.source == "command line" and info.value.key == "vault.sync"


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), ("1KiB", 1024), ("1.5MB", 1_500_000), ("10GiB", 10 * 1024**3), ("2 gb", 2e9)],
)
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_token_comes_from_file_or_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    cfg = config_from_dict({"auth": {"token_file": str(token_file)}})
    assert cfg.auth.load_token() == "from-file"
    monkeypatch.setenv("MY_TOKEN", "from-env")
    assert config_from_dict({"auth": {"token_env": "MY_TOKEN"}}).auth.load_token() == "from-env"
    monkeypatch.delenv("TIERKV_TOKEN", raising=False)
    assert Config().auth.load_token() is None
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="empty"):
        config_from_dict({"auth": {"token_file": str(tmp_path / "empty")}}).auth.load_token()
