"""The settings schema: every section of tierkv.toml as a frozen dataclass, and the types it uses.

A field carries its default and bounds once (:func:`setting`); :mod:`.coerce` checks every source of
settings against these dataclasses. ``[cluster.kv_cold]`` may be a single table (the 0.1 seed format) or
an array of tables ``[[cluster.kv_cold]]`` listing several vaults that the client shards across.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Literal, TypeVar

from tierkv.endpoints import host_problem, join_host_port
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
)
from tierkv.roles import Role

SyncMode = Literal["durable", "fast"]


PolicyName = Literal["adaptive", "lru", "priority-lru", "context"]


LogLevel = Literal["debug", "info", "warning", "error"]


DEFAULT_PORT = 50051


BUILTIN = "<built-in defaults>"


MAX_VAULT_BYTES = 1024**5
"""The largest ``max_bytes`` (1 PiB): LMDB's map is four times the budget, and past this it exceeds what a
64-bit address space (and LMDB's size arithmetic) holds."""


MAX_GRPC_MESSAGE_BYTES = 2**31 - 1
"""gRPC takes its message limits as a C int."""


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


def human_bytes(n: float) -> str:
    """``n`` bytes for a person to read, one decimal in the largest binary unit: 1.0 GiB, 512 B."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


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
        problem = host_problem(self.host)
        if problem:
            raise ConfigError(source, f"{key}.host", problem)


@dataclasses.dataclass(frozen=True)
class TLSConfig:
    """TLS for the vault (server side) or for the client (verifying the vault)."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.key_file or self.ca_file)

    def _validate(self, source: str, key: str) -> None:
        # a key without its certificate (or the reverse) is TLS half-configured: refused on either side,
        # never taken as "TLS off" (a vault would serve plaintext, its bulk port included)
        if bool(self.cert_file) != bool(self.key_file):
            given, missing = ("key_file", "cert_file") if self.key_file else ("cert_file", "key_file")
            problem = (
                f"empty while {key}.{given} is set: a certificate needs both tls.cert_file and "
                f"tls.key_file (leave [tls] empty for no TLS)"
            )
            raise ConfigError(source, f"{key}.{missing}", problem)


MAX_TOKEN_FILE_BYTES = 1024**2
"""A token file is read only up to this size: a device (``/dev/zero``) would otherwise be read until the
memory ran out."""


def read_token_file_bytes(path: Path) -> bytes:
    """The bytes of a token file; OSError when it is not a regular file of at most
    :data:`MAX_TOKEN_FILE_BYTES` (opened without blocking: a FIFO would stall the start for good)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        raw = f.read(MAX_TOKEN_FILE_BYTES + 1)
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        raise OSError(errno.EFBIG, f"larger than {format_size(MAX_TOKEN_FILE_BYTES)}, not a token file")
    return raw


@dataclasses.dataclass(frozen=True)
class AuthConfig:
    """Shared-token auth. The token itself never appears in the file or on a command line."""

    token_file: str = ""
    token_env: str = "TIERKV_TOKEN"
    allow_open: bool = False
    """A vault with no token answers anyone who reaches it, so it refuses to listen on more than loopback
    unless this says the network is trusted (as Redis's protected mode does)."""

    def load_token(self, source: str = "auth") -> str | None:
        """The token from ``token_file`` (first line), else from ``$token_env``; None if neither is set."""
        if self.token_file:
            path = Path(self.token_file).expanduser()
            try:
                token = read_token_file_bytes(path).decode().strip()
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
    max_bytes: ByteSize = setting(
        ByteSize(8 * 1024**3), minimum=1024**2, maximum=MAX_VAULT_BYTES, what="a size"
    )
    sync: SyncMode = "durable"
    policy: PolicyName = "adaptive"
    on_damage: Literal["refuse", "move-aside"] = "refuse"
    sync_interval_s: float = setting(1.0, positive=True)
    metrics_host: str = ""
    metrics_port: int = _port(0)
    workers: int = setting(16, minimum=1)
    """Vault calls (both transports) that run at once; twice as many may wait up to 0.25 s for a slot, one
    connection holds at most this many, and with several tenants one tenant runs at most 3/4 of them. Past
    that a call is refused (RESOURCE_EXHAUSTED: a miss to the client). Health checks are never counted."""
    max_message_bytes: ByteSize = setting(
        ByteSize(MAX_MESSAGE_BYTES), minimum=64 * 1024, maximum=MAX_GRPC_MESSAGE_BYTES, what="a size"
    )
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
        for name in ("host", "metrics_host"):
            problem = host_problem(getattr(self, name)) if getattr(self, name) else ""
            if problem:
                raise ConfigError(source, f"{key}.{name}", problem)
        if self.frame_bytes > self.max_message_bytes // 2:
            raise ConfigError(source, f"{key}.frame_bytes", "expected 4KiB .. max_message_bytes / 2")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """The inference side's view: which vaults serve which role, and how to call them."""

    role: Role = Role.INFERENCE
    timeout: float = setting(2.0, positive=True)
    replication: int = setting(1, minimum=1)
    prefetch_bytes: ByteSize = setting(ByteSize(0), minimum=0)
    """Host memory for blocks prefetched after a restore (docs/concepts/prefetch.md); 0 = off."""
    prefetch_timeout_s: float = setting(0.5, positive=True)
    decode_behind: bool = False
    """Restores decode each blob while the rest still arrives: for links slower than the decoder (see
    docs/performance/links.md)."""
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
    population shrinks, a turnover with it, and so does the time importance buys (docs/concepts/retention.md).
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
    vault does with the metadata blocks carry (docs/concepts/retention.md)."""

    max_protected_fraction: float = setting(0.5, minimum=0, maximum=1, what="a fraction")
    """Protected bytes per tenant stay under this fraction of its quota (or of the vault's budget for a
    tenant without one), and all tenants' together under this fraction of the budget."""
    weights: ContextWeights = ContextWeights()
    classes: ClassTable = dataclasses.field(default_factory=default_class_table)
    ttl_s: TTLSettings = TTLSettings()
    warm_tokens: bool = False
    """The engine hooks send each stored block's token ids (even without a layout) so ``tierkv snapshot``
    and ``tierkv warm`` can replay the hottest prefixes; off: the ids are the prompt's text to whoever
    reads the vault (docs/concepts/warm-start.md)."""


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


__all__ = [
    "BUILTIN",
    "DEFAULT_PORT",
    "Addresses",
    "AuthConfig",
    "ByteSize",
    "ClassSettings",
    "ClassTable",
    "ClusterConfig",
    "Config",
    "ContextWeights",
    "Endpoint",
    "LogConfig",
    "LogLevel",
    "PolicyName",
    "RetentionConfig",
    "SyncMode",
    "TLSConfig",
    "TTLSettings",
    "VaultConfig",
    "default_class_table",
    "format_size",
    "human_bytes",
    "parse_size",
    "read_token_file_bytes",
    "retention_from_config",
    "setting",
]
