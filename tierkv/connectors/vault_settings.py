"""The vault settings an engine's plugin config carries, on top of tierkv.toml: written once for the
hooks that engines load by module path (SGLang's HiCache backend, LMCache's remote connector).

``config_path`` names a tierkv.toml (vault addresses, timeout, auth, TLS); without it the usual search
order of :func:`tierkv.config.load_config` applies. Inline keys override the file, so the file is
optional::

    {"kv_cold": "127.0.0.1:50051", "codec": "raw", "namespace": "tenant-a", "model_id": "llama-3-8b"}

Every key is checked by tierkv.toml's validator (:func:`tierkv.config.settings_from_dict`): an unknown
key, a wrong type or a value out of bounds is a :class:`~tierkv.errors.ConfigError` reading
``source: key: problem``, raised when the engine builds the plugin (it fails to start, naming the key).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from tierkv.codec import CODECS
from tierkv.config import Addresses, ClusterConfig, Config, load_config, setting, settings_from_dict
from tierkv.errors import ConfigError
from tierkv.roles import Role
from tierkv.tiering.storage import Storage, open_cluster

S = TypeVar("S", bound="VaultSettings")


@dataclasses.dataclass(frozen=True)
class VaultSettings:
    """Vaults, codec and identity of one engine plugin, validated once when the engine builds it.

    ``namespace`` separates tenants (blocks never cross it); ``model_id`` names the weights when the
    engine's own model name does not pin them (a local path that differs between machines).
    ``lookup_lease_ms``: a lookup asks the vaults to keep what it found this long, or until it is read
    (0 = off; the vault caps it at 10 s), so a page reported present is still there when it is fetched.
    """

    config_path: str = ""
    kv_cold: Addresses = Addresses()
    ssm_cold: Addresses = Addresses()
    codec: str = setting("raw", choices=CODECS)
    timeout: float = setting(ClusterConfig.timeout, minimum=0.001)
    namespace: str = ""
    model_id: str = ""
    lookup_lease_ms: int = setting(2000, minimum=0, maximum=10_000)
    config: Config = dataclasses.field(default=Config(), metadata={"internal": True})

    @classmethod
    def from_extra(cls: type[S], extra: Mapping[str, Any], source: str) -> S:
        """``extra`` checked against the fields of ``cls``, the rest taken from tierkv.toml."""
        if not isinstance(extra, Mapping):
            raise ConfigError(source, "<root>", f"expected a table of settings, got {type(extra).__name__}")
        given = settings_from_dict(cls, extra, source)
        config = load_config(given.config_path or None)
        cluster = config.cluster
        from_file: dict[str, Any] = {
            "kv_cold": Addresses(cluster.addresses(Role.KV_COLD)),
            "ssm_cold": Addresses(cluster.addresses(Role.SSM_COLD)),
            "timeout": cluster.timeout,
        }
        inherited = {k: v for k, v in from_file.items() if k not in extra}
        settings = dataclasses.replace(given, config=config, **inherited)
        if not settings.kv_cold:
            raise ConfigError(source, "kv_cold", "at least one kv_cold vault is needed")
        return settings

    def cluster(self) -> Storage:
        """The vaults of these settings (token from ``[auth]``, TLS from ``[tls]`` of the TOML)."""
        roles = {Role.KV_COLD.value: self.kv_cold, Role.SSM_COLD.value: self.ssm_cold}
        return open_cluster(self.config, roles=roles, timeout=self.timeout)


__all__ = ["VaultSettings"]
