"""tierkv.toml: one file, three roles.

The file is searched in this order: an explicit ``--config`` path, ``$TIERKV_CONFIG``, ``./tierkv.toml``,
``~/.config/tierkv/tierkv.toml``; with none of them the built-in defaults apply (a vault on
127.0.0.1:50051). Every section is a frozen dataclass below; the loader walks the dataclasses, so an
unknown key, a wrong type or a bad value is a :class:`~tierkv.errors.ConfigError` naming the file, the
dotted key and what was expected, and nothing half-parsed is ever used.

``[cluster.kv_cold]`` may be a single table (the 0.1 seed format) or an array of tables
``[[cluster.kv_cold]]`` listing several vaults that the client shards across.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from tierkv.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

Role = Literal["inference", "kv_cold", "ssm_cold"]
SyncMode = Literal["durable", "fast"]
PolicyName = Literal["lru", "priority-lru"]
LogLevel = Literal["debug", "info", "warning", "error"]

DEFAULT_PORT = 50051
ENV_CONFIG = "TIERKV_CONFIG"
BUILTIN = "<built-in defaults>"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}


class ByteSize(int):
    """An integer byte count that the config also accepts as a string like ``"10GiB"`` or ``"512MB"``."""


def parse_size(value: str) -> int:
    """``"10GiB"`` → 10737418240; ``"1.5MB"`` → 1500000; ``"4096"`` → 4096."""
    m = _SIZE.match(value)
    if not m:
        raise ValueError(f"not a byte size: {value!r} (use e.g. 1048576, '512MiB' or '10GB')")
    number, unit = float(m.group(1)), (m.group(2) or "").upper()
    base = 1024 if "I" in unit else 1000
    letter = unit[:1] if unit not in ("B", "") else ""
    power = "KMGT".index(letter) + 1 if letter else 0
    return int(number * base**power)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One vault address as the inference side sees it."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    def _validate(self, source: str, key: str) -> None:
        _check_port(self.port, source, f"{key}.port", allow_zero=False)


@dataclasses.dataclass(frozen=True)
class TLSConfig:
    """TLS for the vault (server side) or for the client (verifying the vault)."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.ca_file)


@dataclasses.dataclass(frozen=True)
class AuthConfig:
    """Shared-token auth. The token itself never appears in the file or on a command line."""

    token_file: str = ""
    token_env: str = "TIERKV_TOKEN"

    def load_token(self) -> str | None:
        """The token from ``token_file`` (first line), else from ``$token_env``; None if neither is set."""
        if self.token_file:
            try:
                token = Path(self.token_file).expanduser().read_text().strip()
            except OSError as exc:
                raise ConfigError("auth", "auth.token_file", f"cannot read token file: {exc}") from exc
            if not token:
                raise ConfigError("auth", "auth.token_file", f"{self.token_file} is empty")
            return token
        value = os.environ.get(self.token_env, "").strip() if self.token_env else ""
        return value or None


@dataclasses.dataclass(frozen=True)
class VaultConfig:
    """How ``tierkv vault`` runs on a cold node."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    path: str = ""
    max_bytes: ByteSize = ByteSize(8 * 1024**3)
    sync: SyncMode = "durable"
    policy: PolicyName = "lru"
    sync_interval_s: float = 1.0
    metrics_host: str = ""
    metrics_port: int = 0
    workers: int = 16
    max_message_bytes: ByteSize = ByteSize(64 * 1024**2)
    frame_bytes: ByteSize = ByteSize(4 * 1024**2)
    bulk: bool = True
    bulk_port: int = 0
    max_batch_bytes: ByteSize = ByteSize(1024**3)
    grace_s: float = 5.0

    def resolved_path(self) -> Path:
        """LMDB directory: the configured path, else ``$XDG_DATA_HOME/tierkv/vault-PORT``."""
        if self.path:
            return Path(self.path).expanduser()
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
        return base / "tierkv" / f"vault-{self.port}"

    def _validate(self, source: str, key: str) -> None:
        _check_port(self.port, source, f"{key}.port", allow_zero=True)
        _check_port(self.metrics_port, source, f"{key}.metrics_port", allow_zero=True)
        _check_port(self.bulk_port, source, f"{key}.bulk_port", allow_zero=True)
        if self.max_bytes < 1024 * 1024:
            raise ConfigError(source, f"{key}.max_bytes", "expected at least 1MiB")
        if self.workers < 1:
            raise ConfigError(source, f"{key}.workers", "expected a positive integer")
        if self.max_message_bytes < 64 * 1024:
            raise ConfigError(source, f"{key}.max_message_bytes", "expected at least 64KiB")
        if not 4096 <= self.frame_bytes <= self.max_message_bytes // 2:
            raise ConfigError(source, f"{key}.frame_bytes", "expected 4KiB .. max_message_bytes / 2")
        if self.sync_interval_s <= 0 or self.grace_s < 0:
            raise ConfigError(source, f"{key}.sync_interval_s", "expected a positive number of seconds")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """The inference side's view: which vaults serve which role, and how to call them."""

    role: Role = "inference"
    timeout: float = 2.0
    replication: int = 1
    kv_cold: tuple[Endpoint, ...] = (Endpoint(),)
    ssm_cold: tuple[Endpoint, ...] = ()

    def _validate(self, source: str, key: str) -> None:
        if self.timeout <= 0:
            raise ConfigError(source, f"{key}.timeout", "expected a positive number of seconds")
        if self.replication < 1:
            raise ConfigError(source, f"{key}.replication", "expected an integer >= 1")


@dataclasses.dataclass(frozen=True)
class LogConfig:
    level: LogLevel = "warning"
    json: bool = False


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole tierkv.toml. ``source`` says where it came from (for error messages and ``status``)."""

    cluster: ClusterConfig = ClusterConfig()
    vault: VaultConfig = VaultConfig()
    auth: AuthConfig = AuthConfig()
    tls: TLSConfig = TLSConfig()
    log: LogConfig = LogConfig()
    source: str = dataclasses.field(default=BUILTIN, metadata={"internal": True})


def find_config(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The first config file in the search order, or None for built-in defaults."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(str(path), "--config", "file does not exist")
        return path
    env = os.environ.get(ENV_CONFIG)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise ConfigError(str(path), f"${ENV_CONFIG}", "file does not exist")
        return path
    for candidate in (Path.cwd() / "tierkv.toml", Path.home() / ".config" / "tierkv" / "tierkv.toml"):
        if candidate.is_file():
            return candidate
    return None


def load_config(explicit: str | os.PathLike[str] | None = None) -> Config:
    """Find and parse the config (see the module docstring for the search order)."""
    path = find_config(explicit)
    if path is None:
        return Config()
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "<file>", f"not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(str(path), "<file>", f"cannot read: {exc}") from exc
    return config_from_dict(data, source=str(path))


def config_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Config:
    """Build a validated :class:`Config` from parsed TOML (or any mapping of the same shape)."""
    cfg = _build(Config, data, source, "")
    return dataclasses.replace(cfg, source=source)


def with_overrides(cfg: Config, section: str, **values: Any) -> Config:
    """Apply command-line flags (None = not given) on top of a loaded config, validating them too."""
    given = {k: v for k, v in values.items() if v is not None}
    if not given:
        return cfg
    current = getattr(cfg, section)
    hints = typing.get_type_hints(type(current))
    coerced = {}
    for key, value in given.items():
        if key not in hints:
            raise ConfigError("command line", f"{section}.{key}", "unknown setting")
        coerced[key] = _coerce(hints[key], value, "command line", f"{section}.{key}")
    new = dataclasses.replace(current, **coerced)
    validate = getattr(new, "_validate", None)
    if validate is not None:
        validate("command line", section)
    return dataclasses.replace(cfg, **{section: new})


T = TypeVar("T")


def _build(cls: type[T], data: Mapping[str, Any], source: str, prefix: str) -> T:
    if not isinstance(data, Mapping):
        raise ConfigError(source, prefix or "<root>", f"expected a table, got {_describe(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            raise ConfigError(source, dotted, f"unknown key (expected one of: {', '.join(sorted(fields))})")
        kwargs[key] = _coerce(hints[key], value, source, dotted)
    obj = cls(**kwargs)
    validate = getattr(obj, "_validate", None)
    if validate is not None:
        validate(source, prefix or "<root>")
    return obj


def _coerce(tp: Any, value: Any, source: str, key: str) -> Any:
    origin = get_origin(tp)
    if tp is ByteSize:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(
                source, key, f"expected a byte size (integer or '10GiB'), got {_describe(value)}"
            )
        try:
            size = parse_size(value) if isinstance(value, str) else int(value)
        except ValueError as exc:
            raise ConfigError(source, key, str(exc)) from exc
        if size < 0:
            raise ConfigError(source, key, "expected a non-negative byte size")
        return ByteSize(size)
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(source, key, f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    if origin is tuple:
        (item_tp, _ellipsis) = get_args(tp)
        items = [value] if isinstance(value, Mapping) else value
        if not isinstance(items, list):
            raise ConfigError(source, key, f"expected a table or an array of tables, got {_describe(value)}")
        return tuple(_coerce(item_tp, item, source, f"{key}[{i}]") for i, item in enumerate(items))
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build(tp, value, source, key)
    return _scalar(tp, value, source, key)


def _scalar(tp: Any, value: Any, source: str, key: str) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, key, f"expected true or false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, f"expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(source, key, f"expected a number, got {_describe(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(source, key, f"expected a string, got {_describe(value)}")
        return value
    raise ConfigError(source, key, f"unsupported type {tp!r} in schema")


def _check_port(port: int, source: str, key: str, *, allow_zero: bool) -> None:
    low = 0 if allow_zero else 1
    if not low <= port <= 65535:
        raise ConfigError(source, key, f"expected a port number {low}..65535, got {port}")


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {value!r}"
