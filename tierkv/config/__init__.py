"""tierkv.toml and the one settings schema every source of settings is checked against, by concern.

- :mod:`.schema`: the sections as frozen dataclasses, each field's default and bounds written once;
- :mod:`.coerce`: checking any source of settings against them (``source: key: problem``);
- :mod:`.migrate`: tierkv 0.1 files;
- :mod:`.load`: finding and loading the file, command-line flags over it;
- :mod:`.preflight`: what a start would trip over (files, directories, addresses, ports);
- :mod:`.toml_writer`: the effective config written back.
"""

from tierkv.config.coerce import check_value, settings_from_dict
from tierkv.config.load import ENV_CONFIG, config_from_dict, find_config, load_config, with_overrides
from tierkv.config.migrate import OBSOLETE
from tierkv.config.preflight import check_client_files, check_vault_start
from tierkv.config.schema import (
    BUILTIN,
    DEFAULT_PORT,
    Addresses,
    AuthConfig,
    ByteSize,
    ClassSettings,
    ClassTable,
    ClusterConfig,
    Config,
    ContextWeights,
    Endpoint,
    LogConfig,
    LogLevel,
    PolicyName,
    RetentionConfig,
    SyncMode,
    TLSConfig,
    TTLSettings,
    VaultConfig,
    default_class_table,
    format_size,
    human_bytes,
    parse_size,
    retention_from_config,
    setting,
)
from tierkv.config.toml_writer import config_to_dict, to_toml

__all__ = [
    "BUILTIN",
    "DEFAULT_PORT",
    "ENV_CONFIG",
    "OBSOLETE",
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
    "check_client_files",
    "check_value",
    "check_vault_start",
    "config_from_dict",
    "config_to_dict",
    "default_class_table",
    "find_config",
    "format_size",
    "human_bytes",
    "load_config",
    "parse_size",
    "retention_from_config",
    "setting",
    "settings_from_dict",
    "to_toml",
    "with_overrides",
]
