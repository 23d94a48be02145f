"""The effective config written back as TOML (``tierkv config show``, ``tierkv config init``).

Hand-written because the standard library reads TOML but does not write it, and the output is small: tables,
arrays of tables and scalar values, with keys quoted where TOML requires.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tierkv.config.coerce import fields_of, plain_value
from tierkv.config.schema import (
    Config,
)

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain TOML-able values (roles as names, sizes as integers), without ``source``."""
    return {name: plain_value(getattr(cfg, name)) for name in fields_of(Config)}


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


__all__ = ["config_to_dict", "to_toml"]
