"""tierkv.toml, and the one settings schema every source of settings is checked against.

The file is searched in this order: an explicit ``--config`` path, ``$TIERKV_CONFIG``, ``./tierkv.toml``,
``~/.config/tierkv/tierkv.toml``; with none of them the built-in defaults apply (a vault on
127.0.0.1:50051). Every section is a frozen dataclass below; the loader walks the dataclasses, so an
unknown key, a wrong type or a bad value is a :class:`~tierkv.errors.ConfigError` naming the source, the
dotted key and what was expected (``source: key: problem``), and nothing half-parsed is ever used.

The same walker validates the settings of the engine hooks (vLLM's ``kv_connector_extra_config``,
``TieredSession(...)`` arguments) through :func:`settings_from_dict`: a settings class is a frozen
dataclass whose fields carry their default and bounds once, via :func:`setting`.

``[cluster.kv_cold]`` may be a single table (the 0.1 seed format) or an array of tables
``[[cluster.kv_cold]]`` listing several vaults that the client shards across. The rest of a tierkv 0.1
file (``[cluster.recompute]``, ``[inference]``) is accepted with one warning per obsolete key.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from tierkv.certs import certificate_problem
from tierkv.endpoints import HostPort, join_host_port
from tierkv.errors import ConfigError
from tierkv.limits import FRAME_BYTES, MAX_BATCH_BYTES, MAX_MESSAGE_BYTES
from tierkv.retention.classes import (
    DEFAULT_CLASSES,
    DEFAULT_TTL_S,
    MAX_TTL_S,
    NEUTRAL_IMPORTANCE,
    Durability,
    Retention,
    RetentionClass,
    check_source,
)
from tierkv.roles import Role

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

log = logging.getLogger(__name__)

SyncMode = Literal["durable", "fast"]
PolicyName = Literal["lru", "priority-lru", "context"]
LogLevel = Literal["debug", "info", "warning", "error"]

DEFAULT_PORT = 50051
ENV_CONFIG = "TIERKV_CONFIG"
BUILTIN = "<built-in defaults>"

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)

T = TypeVar("T")


class ByteSize(int):
    """An integer byte count that the config also accepts as a string like ``"10GiB"`` or ``"512MB"``."""


class Addresses(tuple[str, ...]):
    """Vault addresses as ``host:port`` strings; given as one string (comma-separated) or a list of them."""


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


def format_size(n: int) -> str:
    """The shortest exact spelling: 1048576 → ``"1MiB"``, 1500 → ``"1500"``."""
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if n and n % 1024**power == 0:
            return f"{n // 1024**power}{unit}"
    return str(n)


def setting(
    default: T,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
    choices: Iterable[str] = (),
    what: str = "",
) -> T:
    """A settings field: its default and the bounds every source is checked against, written once."""
    meta = {"minimum": minimum, "maximum": maximum, "positive": positive, "choices": tuple(choices)}
    return dataclasses.field(default=default, metadata={**meta, "what": what})  # type: ignore[no-any-return]


def _internal(default: T) -> T:
    return dataclasses.field(default=default, metadata={"internal": True})  # type: ignore[no-any-return]


def _port(default: int, *, allow_zero: bool = True) -> int:
    return setting(default, minimum=0 if allow_zero else 1, maximum=65535, what="a port number")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One vault address as the inference side sees it (formatting and parsing: :class:`HostPort`)."""

    host: str = "127.0.0.1"
    port: int = _port(DEFAULT_PORT, allow_zero=False)

    @property
    def address(self) -> str:
        return join_host_port(self.host, self.port)

    def _validate(self, source: str, key: str) -> None:
        if not self.host.strip():
            raise ConfigError(source, f"{key}.host", "expected a host name or address, got ''")


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

    def load_token(self, source: str = "auth") -> str | None:
        """The token from ``token_file`` (first line), else from ``$token_env``; None if neither is set."""
        if self.token_file:
            path = Path(self.token_file).expanduser()
            try:
                token = path.read_text().strip()
            except OSError as exc:
                problem = f"cannot read the token file {path}: {exc.strerror or exc}"
                raise ConfigError(source, "auth.token_file", problem) from exc
            except UnicodeDecodeError:
                problem = f"the token file {path} is not UTF-8 text"
                raise ConfigError(source, "auth.token_file", problem) from None
            if not token:
                raise ConfigError(source, "auth.token_file", f"the token file {path} is empty")
            return token
        value = os.environ.get(self.token_env, "").strip() if self.token_env else ""
        return value or None


@dataclasses.dataclass(frozen=True)
class VaultConfig:
    """How ``tierkv vault`` runs on a cold node."""

    host: str = "127.0.0.1"
    port: int = _port(DEFAULT_PORT)
    path: str = ""
    max_bytes: ByteSize = setting(ByteSize(8 * 1024**3), minimum=1024**2)
    sync: SyncMode = "durable"
    policy: PolicyName = "lru"
    on_damage: Literal["refuse", "move-aside"] = "refuse"
    sync_interval_s: float = setting(1.0, positive=True)
    metrics_host: str = ""
    metrics_port: int = _port(0)
    workers: int = setting(16, minimum=1)
    """Vault calls (both transports) that run at once; twice as many may wait up to 0.25 s for a slot, one
    connection holds at most this many, and with several tenants one tenant runs at most 3/4 of them. Past
    that a call is refused (RESOURCE_EXHAUSTED: a miss to the client). Health checks are never counted."""
    max_message_bytes: ByteSize = setting(ByteSize(MAX_MESSAGE_BYTES), minimum=64 * 1024)
    frame_bytes: ByteSize = setting(ByteSize(FRAME_BYTES), minimum=4096)
    bulk: bool = True
    bulk_port: int = _port(0)
    bulk_max_connections: int = setting(1024, minimum=1)
    bulk_idle_timeout_s: float = setting(120.0, positive=True)
    bulk_max_inflight_bytes: ByteSize = setting(ByteSize(256 * 1024**2), minimum=1024**2)
    """Request bytes (Put frames, BatchGet bodies) the bulk port buffers at once over every connection; a
    request past it is refused (RESOURCE_EXHAUSTED) and the client sends it over gRPC instead."""
    grpc_bdp_probe: bool = True
    """gRPC's HTTP/2 windows grow with the link's bandwidth-delay product (fast gRPC Puts over long links).
    They also let a sender push far ahead of the vault, so senders that stall can make the transport hold
    what they pushed beyond ``grpc_max_inflight_bytes``; false keeps windows small and that memory bounded
    (see docs/operations/limits.md)."""
    grpc_max_inflight_bytes: ByteSize = setting(ByteSize(256 * 1024**2), minimum=1024**2)
    """Put bytes gRPC calls hold at once before the store writes them; a Put past it is refused
    (RESOURCE_EXHAUSTED: the client counts its blobs as not stored). With several tenants, one tenant holds
    at most three quarters of this budget and of the bulk port's."""
    max_batch_bytes: ByteSize = setting(ByteSize(MAX_BATCH_BYTES), minimum=1)
    grace_s: float = setting(5.0, minimum=0)
    coaccess_window_s: float = setting(30.0, minimum=0)
    """Chains one tenant fetches within this many seconds of each other are linked (prefetch hints)."""

    def resolved_path(self) -> Path:
        """LMDB directory: the configured path, else ``$XDG_DATA_HOME/tierkv/vault-PORT``."""
        if self.path:
            return Path(self.path).expanduser()
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
        return base / "tierkv" / f"vault-{self.port}"

    def _validate(self, source: str, key: str) -> None:
        if self.frame_bytes > self.max_message_bytes // 2:
            raise ConfigError(source, f"{key}.frame_bytes", "expected 4KiB .. max_message_bytes / 2")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """The inference side's view: which vaults serve which role, and how to call them."""

    role: Role = Role.INFERENCE
    timeout: float = setting(2.0, positive=True)
    replication: int = setting(1, minimum=1)
    prefetch_bytes: ByteSize = setting(ByteSize(0), minimum=0)
    """Host memory for blocks prefetched after a restore (README, "Predictive prefetch"); 0 = off."""
    prefetch_timeout_s: float = setting(0.5, positive=True)
    decode_behind: bool = False
    """Restores into a buffer (int8) decode each blob while the rest still arrives: for links slower
    than the decoder (see docs/performance/links.md)."""
    kv_cold: tuple[Endpoint, ...] = (Endpoint(),)
    ssm_cold: tuple[Endpoint, ...] = ()

    def addresses(self, role: Role) -> tuple[str, ...]:
        """``host:port`` of every vault configured for a cold role."""
        return tuple(e.address for e in (self.ssm_cold if role is Role.SSM_COLD else self.kv_cold))

    def _validate(self, source: str, key: str) -> None:
        for role in (Role.KV_COLD, Role.SSM_COLD):
            seen: dict[str, int] = {}
            for i, address in enumerate(self.addresses(role)):
                first = seen.setdefault(address.lower(), i)
                if first != i:
                    problem = f"{address} is listed twice (also as {key}.{role}[{first}])"
                    raise ConfigError(source, f"{key}.{role}[{i}]", problem)


@dataclasses.dataclass(frozen=True)
class ContextWeights:
    """``[retention.weights]``: how the ``context`` eviction policy scores an entry (lowest goes first).

    score = importance·I + hits·log2(1 + decayed hits) + sharing·log2(1 + stored children)
    − size·log2(bytes / 1 KiB) − age·(age in turnovers); a turnover is as many store events (writes,
    reads) as the vault holds entries, but at least ``min_turnover`` events, and hits halve every
    ``hit_half_life`` turnovers without a read. ``min_turnover`` (0: off) keeps what the application said
    worth as many events in a vault far smaller than its working set as in a roomy one: there the
    population shrinks, a turnover with it, and so does the time importance buys (README, "Retention").
    """

    importance: float = setting(4.0, minimum=0, what="a weight")
    hits: float = setting(0.5, minimum=0, what="a weight")
    sharing: float = setting(0.5, minimum=0, what="a weight")
    size: float = setting(0.1, minimum=0, what="a weight")
    age: float = setting(1.0, positive=True)
    hit_half_life: float = setting(1.0, positive=True)
    min_turnover: int = setting(0, minimum=0, what="a number of store events")


@dataclasses.dataclass(frozen=True)
class ClassSettings:
    """``[retention.classes.NAME]``: one source class — how important its blocks are, how long they live
    (their durability's time to live), whether they are protected from eviction."""

    importance: float = setting(NEUTRAL_IMPORTANCE, minimum=0, maximum=1, what="an importance")
    durability: Durability = Durability.SESSION
    protected: bool = False


class ClassTable(Mapping[str, ClassSettings]):
    """``[retention.classes]``: class name → settings, immutable (and hashable, as the config is). A file
    names only what it changes: a default class keeps the fields the file leaves out, a new class starts
    from the neutral defaults."""

    def __init__(self, classes: Mapping[str, ClassSettings]) -> None:
        self._classes = dict(classes)

    def __getitem__(self, name: str) -> ClassSettings:
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)

    def __hash__(self) -> int:
        return hash(frozenset(self._classes.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return f"ClassTable({self._classes!r})"


def default_class_table() -> ClassTable:
    """The built-in classes (:data:`tierkv.retention.DEFAULT_CLASSES`) as settings."""
    return ClassTable(
        {n: ClassSettings(c.importance, c.durability, c.protected) for n, c in DEFAULT_CLASSES.items()}
    )


def _ttl(durability: Durability) -> float:
    return setting(
        DEFAULT_TTL_S[durability] or 0.0, minimum=0, maximum=MAX_TTL_S, what="seconds (0: no expiry)"
    )


@dataclasses.dataclass(frozen=True)
class TTLSettings:
    """``[retention.ttl_s]``: each durability's time to live in seconds; 0 means no expiry."""

    ephemeral: float = _ttl(Durability.EPHEMERAL)
    session: float = _ttl(Durability.SESSION)
    persistent: float = _ttl(Durability.PERSISTENT)
    permanent: float = _ttl(Durability.PERMANENT)


@dataclasses.dataclass(frozen=True)
class RetentionConfig:
    """``[retention]``: the source classes and times to live the engine hooks tag blocks with, and what a
    vault does with the metadata blocks carry (README, "Retention")."""

    max_protected_fraction: float = setting(0.5, minimum=0, maximum=1, what="a fraction")
    """Protected bytes per tenant stay under this fraction of its quota (or of the vault's budget for a
    tenant without one), and all tenants' together under this fraction of the budget."""
    weights: ContextWeights = ContextWeights()
    classes: ClassTable = dataclasses.field(default_factory=default_class_table)
    ttl_s: TTLSettings = TTLSettings()
    warm_tokens: bool = False
    """The engine hooks send each stored block's token ids (even without a layout) so ``tierkv snapshot``
    and ``tierkv warm`` can replay the hottest prefixes; off: the ids are the prompt's text to whoever
    reads the vault (README, "Warm start")."""


def retention_from_config(config: Config) -> Retention:
    """The class table and times to live of ``[retention]``, as the engine hooks use them."""
    r = config.retention
    classes = {n: RetentionClass(n, c.importance, c.durability, c.protected) for n, c in r.classes.items()}
    ttl = {d: getattr(r.ttl_s, d.value) or None for d in Durability}
    return Retention(classes=classes, ttl_s=ttl, warm_tokens=r.warm_tokens)


@dataclasses.dataclass(frozen=True)
class LogConfig:
    level: LogLevel = "warning"
    json: bool = False
    file: str = ""


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole tierkv.toml. ``source`` says where it came from (for error messages and ``status``)."""

    cluster: ClusterConfig = ClusterConfig()
    vault: VaultConfig = VaultConfig()
    auth: AuthConfig = AuthConfig()
    tls: TLSConfig = TLSConfig()
    log: LogConfig = LogConfig()
    retention: RetentionConfig = RetentionConfig()
    source: str = _internal(BUILTIN)
    flags: frozenset[str] = _internal(frozenset())
    """Dotted keys set on the command line (their errors say so instead of naming the file)."""

    def source_of(self, key: str) -> str:
        """Where the value of ``key`` came from: ``"command line"`` or the file."""
        return "command line" if key in self.flags else self.source

    def token(self) -> str | None:
        """The auth token (see :meth:`AuthConfig.load_token`); an error names this config's file."""
        return self.auth.load_token(self.source)


# -- tierkv 0.1 -------------------------------------------------------------------------------------------

OBSOLETE = {
    "cluster.recompute": "tierkv 0.2 has no recompute node: the engine recomputes what the vaults miss; "
    "remove the table",
    "inference.exo_path": "the EXO hook runs inside EXO's own environment (pip install tierkv there); "
    "remove the key",
    "inference.log_file": "replaced by [log] file (honoured)",
    "inference.memory_threshold": "replaced by [vault] max_bytes on each vault (a byte budget) and the "
    "engine's own KV memory setting",
    "inference.kv_dim": "blobs are self-describing (each header carries its shape); remove the key",
}


def _migrate(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Drop the 0.1 keys with one warning each, carrying ``inference.log_file`` over to ``[log] file``."""
    out = dict(data)
    cluster = out.get("cluster")
    if isinstance(cluster, Mapping) and "recompute" in cluster:
        out["cluster"] = {k: v for k, v in cluster.items() if k != "recompute"}
        log.warning("%s: cluster.recompute: obsolete, ignored: %s", source, OBSOLETE["cluster.recompute"])
    inference = out.pop("inference", None)
    if inference is None:
        return out
    if not isinstance(inference, Mapping):
        raise ConfigError(source, "inference", f"expected a table, got {_describe(inference)}")
    known = sorted(k.split(".")[1] for k in OBSOLETE if k.startswith("inference."))
    for key, value in inference.items():
        dotted = f"inference.{key}"
        if dotted not in OBSOLETE:
            raise ConfigError(
                source, dotted, f"unknown key (tierkv 0.1's [inference] had: {', '.join(known)})"
            )
        log.warning("%s: %s: obsolete, ignored: %s", source, dotted, OBSOLETE[dotted])
        if key == "log_file":
            section = dict(out.get("log") or {})
            section.setdefault("file", value)
            out["log"] = section
    return out


# -- loading ----------------------------------------------------------------------------------------------


def find_config(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The first config file in the search order, or None for built-in defaults."""
    if explicit:
        return _existing_file(Path(explicit).expanduser(), "--config")
    env = os.environ.get(ENV_CONFIG)
    if env:
        return _existing_file(Path(env).expanduser(), f"${ENV_CONFIG}")
    for candidate in (Path.cwd() / "tierkv.toml", Path.home() / ".config" / "tierkv" / "tierkv.toml"):
        if candidate.is_file():
            return candidate
    return None


def _existing_file(path: Path, key: str) -> Path:
    if path.is_dir():
        raise ConfigError(str(path), key, "is a directory; expected a tierkv.toml file")
    if not path.is_file():
        raise ConfigError(str(path), key, "file does not exist")
    return path


def load_config(explicit: str | os.PathLike[str] | None = None) -> Config:
    """Find and parse the config (see the module docstring for the search order)."""
    path = find_config(explicit)
    if path is None:
        return Config()
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "<file>", f"not valid TOML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), "<file>", f"cannot read: {exc}") from exc
    return config_from_dict(data, source=str(path))


def config_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Config:
    """Build a validated :class:`Config` from parsed TOML (or any mapping of the same shape)."""
    if not isinstance(data, Mapping):
        raise ConfigError(source, "<root>", f"expected a table, got {_describe(data)}")
    cfg = _build(Config, _migrate(data, source), source, "")
    return dataclasses.replace(cfg, source=source)


def settings_from_dict(cls: type[T], data: Mapping[str, Any], source: str) -> T:
    """Validate ``data`` against the settings dataclass ``cls`` by tierkv.toml's rules.

    ``source`` names where the values came from (``"kv_connector_extra_config"``, ``"TieredSession"``, a
    file name); an unknown key, a wrong type or a value out of bounds is a :class:`ConfigError` of the
    shape ``source: key: problem``. Keys not given take the field's default.
    """
    return _build(cls, data, source, "")


def with_overrides(cfg: Config, section: str, **values: Any) -> Config:
    """Apply command-line flags (None = not given) on top of a loaded config, validating them too."""
    given = {k: v for k, v in values.items() if v is not None}
    if not given:
        return cfg
    current = getattr(cfg, section)
    new = dataclasses.replace(current, **_coerced(type(current), given, "command line", section))
    _run_validate(new, "command line", section)
    flags = cfg.flags | {f"{section}.{key}" for key in given}
    return dataclasses.replace(cfg, **{section: new}, flags=flags)


def check_value(
    source: str,
    key: str,
    value: T,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
    choices: Iterable[str] = (),
) -> T:
    """``value`` if it keeps these bounds (those of :func:`setting`), else a ConfigError worded alike."""
    bounds = {"minimum": minimum, "maximum": maximum, "positive": positive, "choices": tuple(choices)}
    problem = _out_of_bounds(bounds, value, size=False)
    if problem:
        raise ConfigError(source, key, problem)
    return value


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}


def _run_validate(obj: object, source: str, key: str) -> None:
    validate = getattr(obj, "_validate", None)
    if validate is not None:
        validate(source, key)


def _build(cls: type[T], data: Mapping[str, Any], source: str, prefix: str) -> T:
    if not isinstance(data, Mapping):
        raise ConfigError(source, prefix or "<root>", f"expected a table, got {_describe(data)}")
    obj = cls(**_coerced(cls, data, source, prefix))
    _run_validate(obj, source, prefix or "<root>")
    return obj


def _coerced(cls: type, data: Mapping[str, Any], source: str, prefix: str) -> dict[str, Any]:
    """``data``'s values checked and converted against the fields of ``cls`` (a file's or the flags')."""
    fields = _fields(cls)
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(source, dotted, f"unknown key (expected one of: {', '.join(sorted(fields))})")
        out[key] = _field_value(fields[key], hints[key], value, source, dotted)
    return out


def _field_value(field: dataclasses.Field[Any], tp: Any, value: Any, source: str, key: str) -> Any:
    coerced = _coerce(tp, value, source, key)
    problem = _out_of_bounds(field.metadata, coerced, size=tp is ByteSize)
    if problem:
        raise ConfigError(source, key, problem)
    return coerced


def _out_of_bounds(meta: Mapping[str, Any], value: Any, *, size: bool) -> str:
    """What is wrong with ``value`` under a :func:`setting`'s bounds, or ``""``."""
    choices = meta.get("choices") or ()
    if choices and value not in choices:
        return f"expected one of {', '.join(map(repr, choices))}, got {value!r}"
    if not isinstance(value, (int, float)):
        return ""
    low, high, what = meta.get("minimum"), meta.get("maximum"), meta.get("what") or "a value"
    shown = format_size if size else _plain
    if meta.get("positive") and value <= 0:
        limit = f" and at most {shown(high)}" if high is not None else ""
        return f"expected a positive number{limit}, got {value!r}"
    if low is not None and high is not None and not low <= value <= high:
        return f"expected {what} {shown(low)}..{shown(high)}, got {value!r}"
    if low is not None and value < low:
        return f"expected at least {shown(low)}, got {value!r}"
    if high is not None and value > high:
        return f"expected at most {shown(high)}, got {value!r}"
    return ""


def _plain(n: float) -> str:
    return str(n)


def _coerce(tp: Any, value: Any, source: str, key: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in get_args(tp):
            return None
        (tp,) = [a for a in get_args(tp) if a is not type(None)]
        origin = get_origin(tp)
    special = _SPECIAL.get(tp) or _SPECIAL.get(origin)
    if special is not None:
        return special(tp, value, source, key)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum(tp, value, source, key)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build(tp, value, source, key)
    return _scalar(tp, value, source, key)


def _byte_size(_tp: Any, value: Any, source: str, key: str) -> ByteSize:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(source, key, f"expected a byte size (integer or '10GiB'), got {_describe(value)}")
    try:
        size = parse_size(value) if isinstance(value, str) else int(value)
    except ValueError as exc:
        raise ConfigError(source, key, str(exc)) from exc
    if size < 0:
        raise ConfigError(source, key, "expected a non-negative byte size")
    return ByteSize(size)


def _addresses(_tp: Any, value: Any, source: str, key: str) -> Addresses:
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ConfigError(source, key, f"expected 'host:port' or a list of them, got {_describe(value)}")
    try:
        return Addresses(HostPort.parse(item).address for item in items if item.strip())
    except ValueError as exc:
        raise ConfigError(source, key, str(exc)) from exc


def _literal(tp: Any, value: Any, source: str, key: str) -> Any:
    choices = get_args(tp)
    if value not in choices:
        raise ConfigError(source, key, f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _tuple(tp: Any, value: Any, source: str, key: str) -> tuple[Any, ...]:
    (item_tp, _ellipsis) = get_args(tp)
    items = [value] if isinstance(value, Mapping) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError(source, key, f"expected a table or an array of tables, got {_describe(value)}")
    return tuple(_coerce(item_tp, item, source, f"{key}[{i}]") for i, item in enumerate(items))


def _enum(tp: type[enum.Enum], value: Any, source: str, key: str) -> Any:
    try:
        return tp(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in tp)
        raise ConfigError(source, key, f"expected one of {choices}, got {value!r}") from None


def _class_table(_tp: Any, value: Any, source: str, key: str) -> ClassTable:
    """The default classes with the file's ``[retention.classes.NAME]`` tables laid over them."""
    if not isinstance(value, Mapping):
        raise ConfigError(source, key, f"expected a table of [{key}.NAME] tables, got {_describe(value)}")
    table = dict(default_class_table())
    for name, given in value.items():
        dotted = f"{key}.{name}"
        try:
            check_source(name)
        except ValueError as exc:
            raise ConfigError(source, dotted, str(exc)) from None
        if not name:
            raise ConfigError(source, dotted, "a class needs a name (an empty one means untagged)")
        if not isinstance(given, Mapping):
            raise ConfigError(
                source,
                dotted,
                f"expected a table (importance, durability, protected), got {_describe(given)}",
            )
        base = _plain_value(table.get(name, ClassSettings()))
        table[name] = _build(ClassSettings, {**base, **given}, source, dotted)
    return ClassTable(table)


_SPECIAL: dict[Any, Callable[[Any, Any, str, str], Any]] = {
    ByteSize: _byte_size,
    Addresses: _addresses,
    Literal: _literal,
    tuple: _tuple,
    ClassTable: _class_table,
}


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


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {value!r}"


# -- what a start would trip over -------------------------------------------------------------------------


def check_client_files(cfg: Config) -> None:
    """The token and TLS files the inference side reads exist and are readable (else a ConfigError)."""
    cfg.token()
    tls = cfg.tls
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError(cfg.source, "tls", "a client certificate needs both tls.cert_file and tls.key_file")
    _check_readable(cfg, ("ca_file", "cert_file", "key_file"))


def check_vault_start(cfg: Config, *, ready_file: str | None = None, create: bool = True) -> None:
    """Everything ``tierkv vault`` would otherwise fail on with a traceback, checked before it starts.

    The TLS files, the data directory (created here if missing and ``create``), the ready file's directory,
    the bind address (resolvable and local) and the metrics port (free). The token file is read by the
    vault's own parser (:func:`tierkv.vault.auth.load_tokens`); a taken gRPC port is left to the server,
    which reports it with its own exit code.
    """
    vc = cfg.vault
    if cfg.tls.enabled:
        if not (cfg.tls.cert_file and cfg.tls.key_file):
            raise ConfigError(cfg.source, "tls", "a vault needs both tls.cert_file and tls.key_file")
        _check_readable(cfg, ("cert_file", "key_file", "ca_file"))
    _check_data_dir(vc.resolved_path(), cfg.source_of("vault.path"), create=create)
    if ready_file:
        parent = Path(ready_file).expanduser().absolute().parent
        if not parent.is_dir():
            raise ConfigError("command line", "--ready-file", f"directory {parent} does not exist")
    _check_local_address(vc.host, cfg.source_of("vault.host"), "vault.host")
    if vc.metrics_port:
        key = "vault.metrics_host" if vc.metrics_host else "vault.host"
        _check_local_address(vc.metrics_host or vc.host, cfg.source_of(key), key)
        source = cfg.source_of("vault.metrics_port")
        _check_free_port(vc.metrics_host or vc.host, vc.metrics_port, source, "vault.metrics_port")


def _check_readable(cfg: Config, names: Iterable[str]) -> None:
    """Each named TLS file can be read, and each certificate among them is valid now."""
    for name in names:
        value = getattr(cfg.tls, name)
        if not value:
            continue
        path = Path(value).expanduser()
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise ConfigError(
                cfg.source, f"tls.{name}", f"cannot read {path}: {exc.strerror or exc}"
            ) from exc
        problem = certificate_problem(path) if name in ("cert_file", "ca_file") else None
        if problem:
            raise ConfigError(cfg.source, f"tls.{name}", f"{path}: {problem}")


def _check_data_dir(path: Path, source: str, *, create: bool) -> None:
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)  # as the store makes it: 0700
        except OSError as exc:
            raise ConfigError(source, "vault.path", f"cannot create {path}: {exc.strerror or exc}") from exc
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(source, "vault.path", f"{existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            source, "vault.path", f"cannot create files in {existing}: not writable by this user"
        )


def _check_local_address(host: str, source: str, key: str) -> None:
    problem = _bind_problem(host, 0, source, key)
    if problem:
        raise ConfigError(source, key, f"cannot bind {host!r}: {problem} (not an address of this machine?)")


def _check_free_port(host: str, port: int, source: str, key: str) -> None:
    problem = _bind_problem(host, port, source, key)
    if problem:
        raise ConfigError(
            source, key, f"port {port} on {host} is taken ({problem}); pick another or 0 for none"
        )


def _bind_problem(host: str, port: int, source: str, key: str) -> str:
    """Why binding ``host:port`` fails right now ('' if it would not); the probe socket is closed at once."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(source, key, f"cannot resolve {host!r}: {exc}") from exc
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return str(exc.strerror or exc)
    return ""


# -- the effective config, written back -------------------------------------------------------------------


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain TOML-able values (roles as names, sizes as integers), without ``source``."""
    return {name: _plain_value(getattr(cfg, name)) for name in _fields(Config)}


def _plain_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: _plain_value(getattr(value, name)) for name in _fields(type(value))}
    if isinstance(value, Mapping):
        return {k: _plain_value(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain_value(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bool):
        return value
    return int(value) if isinstance(value, int) else value


def to_toml(data: Mapping[str, Mapping[str, Any]]) -> str:
    """TOML text for a mapping of tables (what :func:`config_to_dict` returns); tomllib reads it back."""
    lines: list[str] = []
    for name, table in data.items():
        _toml_table(name, table, lines, array=False)
    return "\n".join(lines).strip() + "\n"


def _toml_table(name: str, table: Mapping[str, Any], lines: list[str], *, array: bool) -> None:
    lines += ["", f"[[{name}]]" if array else f"[{name}]"]
    nested = {}
    for key, value in table.items():
        tables = isinstance(value, list) and bool(value) and isinstance(value[0], Mapping)
        if isinstance(value, Mapping) or tables:
            nested[key] = value
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in nested.items():
        for item in [value] if isinstance(value, Mapping) else value:
            _toml_table(f"{name}.{_toml_key(key)}", item, lines, array=isinstance(value, list))


def _toml_key(key: str) -> str:
    """A bare key when TOML allows one, else a quoted one (class names may hold any printable text)."""
    return key if _BARE_KEY.fullmatch(key) else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + "".join(_toml_char(c) for c in str(value)) + '"'


def _toml_char(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    return f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c
