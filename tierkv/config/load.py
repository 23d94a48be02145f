"""Finding and loading tierkv.toml, and command-line flags laid over it.

The file is searched in this order: an explicit ``--config`` path, ``$TIERKV_CONFIG``, ``./tierkv.toml``,
``~/.config/tierkv/tierkv.toml``; with none of them the built-in defaults apply (a vault on
127.0.0.1:50051).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tierkv.config.coerce import build, coerced, describe, run_validate
from tierkv.config.migrate import migrate
from tierkv.config.schema import (
    Config,
)
from tierkv.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


ENV_CONFIG = "TIERKV_CONFIG"


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
    if not path.exists():
        raise ConfigError(str(path), key, "file does not exist")
    if not (path.is_file() or path.is_char_device()):  # /dev/null: the defaults
        # a pipe (-c <(...)) reads once, and an engine's processes each read the file
        raise ConfigError(str(path), key, "is not a regular file; expected a tierkv.toml file")
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
        raise ConfigError(source, "<root>", f"expected a table, got {describe(data)}")
    cfg = build(Config, migrate(data, source), source, "")
    return dataclasses.replace(cfg, source=source)


def with_overrides(cfg: Config, section: str, **values: Any) -> Config:
    """Apply command-line flags (None = not given) on top of a loaded config, validating them too."""
    given = {k: v for k, v in values.items() if v is not None}
    if not given:
        return cfg
    current = getattr(cfg, section)
    new = dataclasses.replace(current, **coerced(type(current), given, "command line", section))
    run_validate(new, "command line", section)
    flags = cfg.flags | {f"{section}.{key}" for key in given}
    return dataclasses.replace(cfg, **{section: new}, flags=flags)


__all__ = ["ENV_CONFIG", "config_from_dict", "find_config", "load_config", "with_overrides"]
