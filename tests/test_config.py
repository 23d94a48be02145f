"""tierkv.toml: search order, the 0.1 seed format, arrays of vaults, and errors that name file and key."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import sys
import typing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierkv.config import (
    OBSOLETE,
    Addresses,
    ByteSize,
    Config,
    check_client_files,
    check_value,
    check_vault_start,
    config_from_dict,
    config_to_dict,
    load_config,
    parse_size,
    retention_from_config,
    setting,
    settings_from_dict,
    to_toml,
    with_overrides,
)
from tierkv.config.coerce import fields_of
from tierkv.endpoints import HostPort
from tierkv.errors import ConfigError
from tierkv.retention import DEFAULT_CLASSES, DEFAULT_TTL_S, Durability, RetentionClass
from tierkv.roles import Role
from tierkv.tiering.checks import SessionSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

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
        ("[vault]\nprot = 1\n", "vault.prot", "unknown key, did you mean 'port'?"),
        ('[vault]\nmax_byte = "1GiB"\n', "vault.max_byte", "unknown key, did you mean 'max_bytes'?"),
        ("[vualt]\nport = 1\n", "vualt", "unknown key, did you mean 'vault'?"),
        ('[vault]\nport = "fifty"\n', "vault.port", "expected an integer, got string 'fifty'"),
        ("[vault]\nport = 70000\n", "vault.port", "expected a port number"),
        ('[vault]\nmax_bytes = "lots"\n', "vault.max_bytes", "not a byte size"),
        ('[vault]\nsync = "sometimes"\n', "vault.sync", "expected one of 'durable', 'fast'"),
        ("[cluster]\ntimeout = -1\n", "cluster.timeout", "positive"),
        ('[cluster]\nrole = "gpu"\n', "cluster.role", "expected one of"),
        ("[cluster.kv_cold]\nport = true\n", "cluster.kv_cold[0].port", "expected an integer"),
        ("vault = 3\n", "vault", "expected a table"),
        ("[[cluster.kv_cold]]\nhots = 'x'\n", "cluster.kv_cold[0].hots", "unknown key"),
        (
            '[cluster.kv_cold]\nhost = "10.0.0.5:50051"\n',
            "cluster.kv_cold[0].host",
            "without a port, got '10.0.0.5:50051' (port = 50051 is its own key)",
        ),
        (
            '[cluster.kv_cold]\nhost = "http://10.0.0.5"\n',
            "cluster.kv_cold[0].host",
            "no scheme, path or spaces",
        ),
        ('[cluster.kv_cold]\nhost = "10.0.0.5 "\n', "cluster.kv_cold[0].host", "no scheme, path or spaces"),
        ('[vault]\nhost = "0.0.0.0:50051"\n', "vault.host", "without a port"),
        ('[vault]\nmetrics_host = "localhost:9100"\n', "vault.metrics_host", "without a port"),
        ("[vault\n", "<file>", "not valid TOML"),
        ("[retention.classes.axioms]\nimportance = 1.5\n", "retention.classes.axioms.importance", "0..1"),
        ('[retention.classes.tools]\nimportance = "high"\n', "retention.classes.tools.importance", "number"),
        ('[retention.classes.x]\ndurability = "forever"\n', "retention.classes.x.durability", "'ephemeral'"),
        ("[retention.classes.x]\nprotected = 1\n", "retention.classes.x.protected", "true or false"),
        ("[retention.classes.x]\npinned = true\n", "retention.classes.x.pinned", "unknown key"),
        ("[retention]\nclasses = 3\n", "retention.classes", "expected a table"),
        ("[retention.classes]\nx = 3\n", "retention.classes.x", "expected a table"),
        ('[retention.classes.""]\nprotected = true\n', "retention.classes.", "needs a name"),
        (f"[retention.classes.{'a' * 65}]\n", f"retention.classes.{'a' * 65}", "at most 64 bytes"),
        ("[retention.ttl_s]\nsession = -1\n", "retention.ttl_s.session", "0..3153600000"),
        ("[retention.ttl_s]\nweekly = 5\n", "retention.ttl_s.weekly", "unknown key"),
        ('[retention.ttl_s]\nephemeral = "1h"\n', "retention.ttl_s.ephemeral", "expected a number"),
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


# -- one schema for every source -------------------------------------------------------------------------

SEED_01 = """
[cluster]
role = "inference"
[cluster.kv_cold]
host = "10.0.0.2"
port = 50051
[cluster.recompute]
host = "10.0.0.4"
port = 50053
[inference]
exo_path = "/opt/exo"
log_file = "LOGFILE"
memory_threshold = 0.85
kv_dim = 128
"""


def test_the_01_config_is_accepted_with_one_warning_per_obsolete_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, SEED_01.replace("LOGFILE", str(tmp_path / "tierkv.log")))
    with caplog.at_level(logging.WARNING, logger="tierkv.config"):
        cfg = load_config(path)
    warned = [r.getMessage() for r in caplog.records]
    obsolete = ["cluster.recompute", "inference.exo_path", "inference.log_file"]
    obsolete += ["inference.memory_threshold", "inference.kv_dim"]
    assert len(warned) == len(obsolete)
    for key, message in zip(obsolete, warned, strict=True):
        assert message.startswith(f"{path}: {key}: obsolete") and OBSOLETE[key] in message
    assert cfg.log.file == str(tmp_path / "tierkv.log"), "log_file is honoured as [log] file"
    assert [e.address for e in cfg.cluster.kv_cold] == ["10.0.0.2:50051"]


def test_an_unknown_key_in_the_01_inference_table_is_still_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "[inference]\nexo_pth = 1\n"))
    assert info.value.key == "inference.exo_pth" and "exo_path" in info.value.problem


def test_a_new_log_file_setting_wins_over_the_01_one(tmp_path: Path) -> None:
    text = '[log]\nfile = "new.log"\n[inference]\nlog_file = "old.log"\n'
    assert load_config(write(tmp_path, text)).log.file == "new.log"


def test_duplicate_vaults_in_a_role_are_refused(tmp_path: Path) -> None:
    text = '[[cluster.kv_cold]]\nhost = "a"\nport = 1\n[[cluster.kv_cold]]\nhost = "b"\nport = 1\n'
    text += '[[cluster.kv_cold]]\nhost = "A"\nport = 1\n'
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert info.value.key == "cluster.kv_cold[2]"
    assert "a:1 is listed twice" in info.value.problem.lower() and "cluster.kv_cold[0]" in info.value.problem
    ipv6 = '[[cluster.ssm_cold]]\nhost = "::1"\nport = 5\n[[cluster.ssm_cold]]\nhost = "[::1]"\nport = 5\n'
    with pytest.raises(ConfigError, match=r"\[::1\]:5 is listed twice"):
        load_config(write(tmp_path, ipv6))


def test_roles_are_the_shared_role_type() -> None:
    cfg = config_from_dict({"cluster": {"role": "ssm_cold"}})
    assert cfg.cluster.role is Role.SSM_COLD
    assert cfg.cluster.addresses(Role.KV_COLD) == ("127.0.0.1:50051",)


def test_endpoint_formats_ipv6_through_hostport() -> None:
    cfg = config_from_dict(
        {"cluster": {"kv_cold": [{"host": "::1", "port": 7}, {"host": "[fe80::1]", "port": 8}]}}
    )
    assert cfg.cluster.addresses(Role.KV_COLD) == ("[::1]:7", "[fe80::1]:8")


@dataclasses.dataclass(frozen=True)
class HookSample:
    codec: str = setting("raw", choices=("raw", "int8"))
    threads: int = setting(2, minimum=1)
    fraction: float = setting(0.5, positive=True, maximum=1.0)
    budget: ByteSize = setting(ByteSize(1024), minimum=512)
    vaults: Addresses = Addresses()
    model_id: str | None = None


@pytest.mark.parametrize(
    ("data", "key", "problem"),
    [
        ({"codec": "zstd"}, "codec", "expected one of 'raw', 'int8', got 'zstd'"),
        ({"threads": 0}, "threads", "expected at least 1, got 0"),
        ({"threads": True}, "threads", "expected an integer"),
        ({"fraction": 0}, "fraction", "expected a positive number and at most 1.0, got 0"),
        ({"fraction": 1.5}, "fraction", "expected at most 1.0, got 1.5"),
        ({"budget": "100B"}, "budget", "expected at least 512, got 100"),
        ({"vaults": "h:1,nohost"}, "vaults", "expected host:port"),
        ({"vaults": "::1:5"}, "vaults", "brackets"),
        ({"vaults": 5}, "vaults", "expected 'host:port' or a list of them"),
        ({"model_id": 3}, "model_id", "expected a string"),
        ({"codecs": "raw"}, "codecs", "unknown key, did you mean 'codec'? (expected one of: budget, codec"),
        ({"vaultz": "h:1"}, "vaultz", "unknown key, did you mean 'vaults'?"),
        ({"compression": "int8"}, "compression", "unknown key (expected one of: budget, codec"),
    ],
)
def test_any_source_gets_the_same_checks_and_error_shape(
    data: dict[str, object], key: str, problem: str
) -> None:
    for source in ("kv_connector_extra_config", "TieredSession", "/etc/tierkv/hook.toml"):
        with pytest.raises(ConfigError) as info:
            settings_from_dict(HookSample, data, source)
        assert (info.value.source, info.value.key) == (source, key)
        assert problem in info.value.problem
        assert str(info.value).startswith(f"{source}: {key}: ")


def test_dev_null_is_the_defaults_and_a_pipe_is_refused_as_what_it_is() -> None:
    """``-c /dev/null`` was "file does not exist"; so was ``-c <(...)``, which is refused because a pipe
    reads once and an engine's processes each read the file."""
    assert load_config("/dev/null") == dataclasses.replace(Config(), source="/dev/null")
    read, write = os.pipe()
    os.write(write, b"[vault]\nport = 7\n")
    os.close(write)  # a reader that got past the check would read this, not block
    try:
        with pytest.raises(ConfigError, match="is not a regular file"):
            load_config(f"/dev/fd/{read}")
    finally:
        os.close(read)


@pytest.mark.parametrize("host", ["::1", "[::1]", "fe80::1%eth0", "vault-1.example", "10.0.0.5", "localhost"])
def test_a_host_without_a_port_is_fine_ipv6_literals_included(tmp_path: Path, host: str) -> None:
    cfg = load_config(
        write(tmp_path, f'[cluster.kv_cold]\nhost = "{host}"\nport = 7\n[vault]\nhost = "{host}"\n')
    )
    assert cfg.cluster.kv_cold[0].port == 7 and cfg.vault.host == host


def test_settings_take_defaults_and_coerce_values() -> None:
    assert settings_from_dict(HookSample, {}, "x") == HookSample()
    s = settings_from_dict(HookSample, {"budget": "1KiB", "vaults": "h:1, [::1]:2", "model_id": None}, "x")
    assert s.budget == 1024 and s.vaults == ("h:1", "[::1]:2") and s.model_id is None
    assert settings_from_dict(HookSample, {"vaults": ["a:1"]}, "x").vaults == ("a:1",)


def test_session_settings_are_the_transformers_hook_schema() -> None:
    assert SessionSettings.from_options({}) == SessionSettings()
    s = SessionSettings.from_options({"codec": "int8", "hot_bytes": "64MiB", "model_id": "m"})
    assert (s.codec, s.hot_bytes, s.model_id) == ("int8", 64 << 20, "m")
    for bad, key in (({"codec": "zstd"}, "codec"), ({"block_size": 0}, "block_size")):
        with pytest.raises(ConfigError) as info:
            SessionSettings.from_options(bad)
        assert (info.value.source, info.value.key) == ("TieredSession", key)
    with pytest.raises(ConfigError, match="min_text_fraction: expected a positive number"):
        SessionSettings.from_options({"min_text_fraction": 0.0})


@given(
    port=st.integers(0, 65535),
    max_bytes=st.integers(1024**2, 1 << 50),
    host=st.one_of(
        st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,19}", fullmatch=True), st.ip_addresses().map(str)
    ),
    text=st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=20),
    sync=st.sampled_from(["durable", "fast"]),
    grace=st.floats(0, 1e6, allow_nan=False),
    n_vaults=st.integers(0, 3),
    role=st.sampled_from(list(Role)),
)
def test_the_effective_config_reads_back_as_itself(
    port: int, max_bytes: int, host: str, text: str, sync: str, grace: float, n_vaults: int, role: Role
) -> None:
    vaults = [{"host": host, "port": i + 1} for i in range(n_vaults)]
    data = {
        "cluster": {"role": role.value, "ssm_cold": vaults},
        "vault": {"host": host, "port": port, "max_bytes": max_bytes, "sync": sync, "grace_s": grace},
        "log": {"file": text},
    }
    cfg = config_from_dict(data, source="s")
    text = to_toml(config_to_dict(cfg))
    assert config_from_dict(tomllib.loads(text), source="s") == cfg


# -- what a start would trip over ------------------------------------------------------------------------


def test_a_missing_token_file_names_the_config_file_the_section_and_the_token_file(tmp_path: Path) -> None:
    path = write(tmp_path, f'[auth]\ntoken_file = "{tmp_path / "nope"}"\n')
    with pytest.raises(ConfigError) as info:
        check_client_files(load_config(path))
    assert info.value.source == str(path) and info.value.key == "auth.token_file"
    assert str(tmp_path / "nope") in info.value.problem and "No such file" in info.value.problem


def test_tls_files_are_checked_before_use(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("x")
    cfg = config_from_dict(
        {"tls": {"cert_file": str(tmp_path / "cert.pem"), "key_file": str(tmp_path / "k")}}
    )
    for check in (check_client_files, check_vault_start):
        with pytest.raises(ConfigError) as info:
            check(cfg)
        assert info.value.key == "tls.key_file" and str(tmp_path / "k") in info.value.problem
    with pytest.raises(ConfigError, match=r"needs both tls\.cert_file and tls\.key_file"):
        config_from_dict({"tls": {"cert_file": str(tmp_path / "cert.pem")}})


def vault_cfg(tmp_path: Path, **flags: object) -> Config:
    return with_overrides(Config(), "vault", **{"path": str(tmp_path / "v"), "port": 0, **flags})


def test_the_vault_start_check_names_the_flag_that_is_wrong(tmp_path: Path) -> None:
    check_vault_start(vault_cfg(tmp_path), ready_file=str(tmp_path / "ready"))
    assert (tmp_path / "v").is_dir()
    (tmp_path / "file").write_text("")
    cases = [
        (vault_cfg(tmp_path, path=str(tmp_path / "file" / "sub")), "vault.path", "cannot create"),
        (vault_cfg(tmp_path, host="no-such-host.invalid"), "vault.host", "cannot resolve"),
        (vault_cfg(tmp_path, host="192.0.2.1"), "vault.host", "not an address of this machine"),
    ]
    for cfg, key, problem in cases:
        with pytest.raises(ConfigError) as info:
            check_vault_start(cfg)
        assert (info.value.source, info.value.key) == ("command line", key) and problem in info.value.problem
    with pytest.raises(ConfigError) as info:
        check_vault_start(vault_cfg(tmp_path), ready_file=str(tmp_path / "no" / "ready"))
    assert info.value.key == "--ready-file" and str(tmp_path / "no") in info.value.problem


def test_a_taken_metrics_port_is_found_before_the_vault_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cfg = vault_cfg(tmp_path, metrics_port=taken.getsockname()[1])
        with pytest.raises(ConfigError) as info:
            check_vault_start(cfg)
    assert info.value.key == "vault.metrics_port" and "is taken" in info.value.problem
    check_vault_start(cfg)  # free again


def test_a_check_does_not_create_the_data_directory(tmp_path: Path) -> None:
    check_vault_start(vault_cfg(tmp_path), create=False)
    assert not (tmp_path / "v").exists()


def test_a_directory_given_as_the_config_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
)


@given(st.lists(st.tuples(hosts, st.integers(1, 65535)), max_size=4), st.sampled_from([", ", ",", " ,  "]))
def test_address_lists_parse_as_hostport_formats_them(pairs: list[tuple[str, int]], sep: str) -> None:
    addresses = [HostPort(h, p).address for h, p in pairs]
    parsed = settings_from_dict(HookSample, {"vaults": sep.join(addresses)}, "x").vaults
    assert parsed == tuple(addresses)
    assert settings_from_dict(HookSample, {"vaults": addresses}, "x").vaults == tuple(addresses)


# -- [retention] classes and times to live ----------------------------------------------------------------

class_names = st.text(
    alphabet=st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"]), min_size=1, max_size=20
).filter(lambda n: n.isprintable() and len(n.encode()) <= 64)
class_fields = st.fixed_dictionaries(
    {},
    optional={
        "importance": st.floats(0, 1, allow_nan=False),
        "durability": st.sampled_from([d.value for d in Durability]),
        "protected": st.booleans(),
    },
)


@given(
    classes=st.dictionaries(st.one_of(st.sampled_from(sorted(DEFAULT_CLASSES)), class_names), class_fields),
    ttl=st.dictionaries(st.sampled_from([d.value for d in Durability]), st.floats(0, 86400.0 * 365)),
)
def test_retention_classes_lay_the_file_over_the_defaults(
    classes: dict[str, dict[str, object]], ttl: dict[str, float]
) -> None:
    cfg = config_from_dict({"retention": {"classes": classes, "ttl_s": ttl}}, source="r.toml")
    retention = retention_from_config(cfg)
    assert set(retention.classes) == set(DEFAULT_CLASSES) | set(classes)
    for name, c in retention.classes.items():
        base = DEFAULT_CLASSES.get(name) or RetentionClass(name)
        given_fields = classes.get(name, {})
        assert c.importance == given_fields.get("importance", base.importance)
        assert c.durability.value == given_fields.get("durability", base.durability.value)
        assert c.protected == given_fields.get("protected", base.protected)
        meta = retention.meta(name)
        assert meta.protected == c.protected and meta.importance == c.importance
        expected_ttl = ttl.get(c.durability.value, DEFAULT_TTL_S[c.durability] or 0.0)
        assert meta.ttl_s == (expected_ttl or None)
    # what `tierkv config show` prints reads back as the same config, odd class names included
    assert config_from_dict(tomllib.loads(to_toml(config_to_dict(cfg))), source="r.toml") == cfg


def test_retention_defaults_are_the_built_in_classes() -> None:
    retention = retention_from_config(Config())
    assert dict(retention.classes) == dict(DEFAULT_CLASSES)
    assert dict(retention.ttl_s) == dict(DEFAULT_TTL_S)
    hash(Config())  # the config stays hashable with its class table


def test_the_example_documents_every_retention_class() -> None:
    example = Path(__file__).parent.parent / "tierkv.toml.example"
    cfg = load_config(example)
    assert cfg.retention == Config().retention
    text = example.read_text()
    for name in DEFAULT_CLASSES:
        assert f"[retention.classes.{name}]" in text


def float_keys(cls: type, prefix: str = "") -> list[str]:
    """The dotted key of every float setting under ``cls`` (a schema dataclass), nested tables included."""
    hints = typing.get_type_hints(cls)
    keys = []
    for name in fields_of(cls):
        dotted, tp = f"{prefix}{name}", hints[name]
        if tp is float:
            keys.append(dotted)
        elif dataclasses.is_dataclass(tp) and isinstance(tp, type):
            keys += float_keys(tp, f"{dotted}.")
    return keys


def nested(dotted: str, value: object) -> dict[str, object]:
    *tables, last = dotted.split(".")
    data: dict[str, object] = {last: value}
    for table in reversed(tables):
        data = {table: data}
    return data


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_no_float_setting_takes_nan_or_infinity(value: float) -> None:
    """TOML spells ``nan`` and ``inf``; every bound compares false against NaN, so a NaN interval passed
    "positive" and a vault polled its maintenance in a busy loop (an infinite one killed the thread)."""
    keys = [*float_keys(Config), "retention.classes.tools.importance"]
    assert "vault.sync_interval_s" in keys and "cluster.timeout" in keys and len(keys) > 15
    for key in keys:
        with pytest.raises(ConfigError) as info:
            config_from_dict(nested(key, value))
        assert info.value.key == key and "a finite number" in info.value.problem, key
    with pytest.raises(ConfigError, match="finite"):
        check_value("TieredSession", "timeout", math.nan, positive=True)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[vault]\nsync_interval_s = nan\n", "vault.sync_interval_s"),
        ("[vault]\nmax_bytes = 9223372036854775807\n", "vault.max_bytes"),
        ("[vault]\nmax_bytes = '99999999TiB'\n", "vault.max_bytes"),
        ("[vault]\nmax_message_bytes = '2GiB'\n", "vault.max_message_bytes"),
    ],
)
def test_a_vault_refuses_values_it_cannot_run_with_in_one_line(tmp_path: Path, text: str, key: str) -> None:
    from tests.test_cli import assert_clean_error, tierkv, vault_args

    cfg = write(tmp_path, text)
    assert_clean_error(tierkv(*vault_args(tmp_path, "-c", str(cfg))), key)
