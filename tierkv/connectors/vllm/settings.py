"""The connector's settings: ``kv_connector_extra_config`` on top of tierkv.toml.

``config_path`` names a tierkv.toml (vault addresses, timeout, auth, TLS); without it the usual search
order of :func:`tierkv.config.load_config` applies. Inline keys override the file, so a TOML file is
optional::

    "kv_connector_extra_config": {"kv_cold": "127.0.0.1:50051", "ssm_cold": "127.0.0.1:50052",
                                  "codec": "raw", "namespace": "tenant-a"}
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tierkv.client.cluster import KV_COLD, SSM_COLD, Cluster
from tierkv.codec import CODECS
from tierkv.config import Config, load_config
from tierkv.errors import ConfigError
from tierkv.tiering.checks import at_least, one_of

logger = logging.getLogger(__name__)

SOURCE = "kv_connector_extra_config"
HASH_MODES = ("auto", "engine", "tierkv")
LOAD_MODES = ("async", "sync")


def _addresses(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise ConfigError(SOURCE, key, f"expected 'host:port' or a list of them, got {value!r}")
    items = [v for v in items if v]
    for item in items:
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(SOURCE, key, f"expected host:port, got {item!r}")
    return tuple(items)


def _number(extra: Mapping[str, Any], key: str, default: float, *, minimum: float, integer: bool) -> Any:
    value = extra.get(key, default)
    wrong_type = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if wrong_type:
        kind = "an integer" if integer else "a number"
        raise ConfigError(SOURCE, key, f"expected {kind}, got {value!r}")
    return at_least(SOURCE, key, value, minimum)


def _string(extra: Mapping[str, Any], key: str, default: str) -> str:
    value = extra.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(SOURCE, key, f"expected a string, got {value!r}")
    return value


def _choice(extra: Mapping[str, Any], key: str, default: str, choices: Iterable[str]) -> str:
    return one_of(SOURCE, key, _string(extra, key, default), choices)


KNOWN_KEYS = frozenset(
    {
        "config_path",
        "kv_cold",
        "ssm_cold",
        "codec",
        "timeout",
        "namespace",
        "model_id",
        "hash",
        "load_mode",
        "max_inflight_stores",
        "max_queued_stores",
        "max_state_probes",
        "load_threads",
        "lookup_threads",
    }
)


@dataclass(frozen=True)
class ConnectorSettings:
    """Everything the connector reads from its extra config, validated once at start-up."""

    config: Config
    kv_cold: tuple[str, ...]
    ssm_cold: tuple[str, ...]
    codec: str = "raw"
    timeout: float = 2.0
    namespace: str = ""
    model_id: str = ""
    hash: str = "auto"
    load_mode: str = "async"
    max_inflight_stores: int = 2
    max_queued_stores: int = 64
    max_state_probes: int = 4
    load_threads: int = 2
    lookup_threads: int = 2

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> ConnectorSettings:
        unknown = sorted(set(extra) - KNOWN_KEYS)
        if unknown:
            expected = ", ".join(sorted(KNOWN_KEYS))
            raise ConfigError(SOURCE, unknown[0], f"unknown key (expected one of: {expected})")
        path = _string(extra, "config_path", "")
        config = load_config(path or None)
        kv_cold = (
            _addresses("kv_cold", extra["kv_cold"])
            if "kv_cold" in extra
            else tuple(e.address for e in config.cluster.kv_cold)
        )
        if not kv_cold:
            raise ConfigError(SOURCE, "kv_cold", "at least one kv_cold vault is needed")
        ssm_cold = (
            _addresses("ssm_cold", extra["ssm_cold"])
            if "ssm_cold" in extra
            else tuple(e.address for e in config.cluster.ssm_cold)
        )
        codec = _choice(extra, "codec", "raw", CODECS)
        hash_mode = _choice(extra, "hash", "auto", HASH_MODES)
        load_mode = _choice(extra, "load_mode", "async", LOAD_MODES)
        return cls(
            config=config,
            kv_cold=kv_cold,
            ssm_cold=ssm_cold,
            codec=codec,
            timeout=float(_number(extra, "timeout", config.cluster.timeout, minimum=0.001, integer=False)),
            namespace=_string(extra, "namespace", ""),
            model_id=_string(extra, "model_id", ""),
            hash=hash_mode,
            load_mode=load_mode,
            max_inflight_stores=_number(extra, "max_inflight_stores", 2, minimum=1, integer=True),
            max_queued_stores=_number(extra, "max_queued_stores", 64, minimum=0, integer=True),
            max_state_probes=_number(extra, "max_state_probes", 4, minimum=1, integer=True),
            load_threads=_number(extra, "load_threads", 2, minimum=1, integer=True),
            lookup_threads=_number(extra, "lookup_threads", 2, minimum=1, integer=True),
        )

    def cluster(self) -> Cluster:
        """A :class:`Cluster` for these vaults (token from ``[auth]``, TLS from ``[tls]`` of the TOML)."""
        return Cluster.from_config(
            self.config, roles={KV_COLD: self.kv_cold, SSM_COLD: self.ssm_cold}, timeout=self.timeout
        )


__all__ = ["HASH_MODES", "KNOWN_KEYS", "LOAD_MODES", "SOURCE", "ConnectorSettings"]
