"""Checking and converting settings against the schema's dataclasses, with one error shape.

The walker goes field by field, so an unknown key, a wrong type or a bad value is a
:class:`~tierkv.errors.ConfigError` naming the source, the dotted key and what was expected (``source: key:
problem``), and nothing half-parsed is ever used. The same walker validates the settings of the engine
hooks (vLLM's ``kv_connector_extra_config``, ``TieredSession(...)`` arguments) through
:func:`settings_from_dict`.

Written by hand rather than with pydantic or msgspec: both word their errors their own way (a list of
locations and messages), and every caller here promises one line of ``source: key: problem``; the walker
is small because the schema is plain dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from tierkv.config.schema import (
    Addresses,
    ByteSize,
    ClassSettings,
    ClassTable,
    default_class_table,
    format_size,
    parse_size,
)
from tierkv.endpoints import HostPort
from tierkv.errors import ConfigError
from tierkv.retention.classes import (
    check_source,
)

T = TypeVar("T")


def settings_from_dict(cls: type[T], data: Mapping[str, Any], source: str) -> T:
    """Validate ``data`` against the settings dataclass ``cls`` by tierkv.toml's rules.

    ``source`` names where the values came from (``"kv_connector_extra_config"``, ``"TieredSession"``, a
    file name); an unknown key, a wrong type or a value out of bounds is a :class:`ConfigError` of the
    shape ``source: key: problem``. Keys not given take the field's default.
    """
    return build(cls, data, source, "")


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


def fields_of(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}


def run_validate(obj: object, source: str, key: str) -> None:
    validate = getattr(obj, "_validate", None)
    if validate is not None:
        validate(source, key)


def build(cls: type[T], data: Mapping[str, Any], source: str, prefix: str) -> T:
    if not isinstance(data, Mapping):
        raise ConfigError(source, prefix or "<root>", f"expected a table, got {describe(data)}")
    obj = cls(**coerced(cls, data, source, prefix))
    run_validate(obj, source, prefix or "<root>")
    return obj


def coerced(cls: type, data: Mapping[str, Any], source: str, prefix: str) -> dict[str, Any]:
    """``data``'s values checked and converted against the fields of ``cls`` (a file's or the flags')."""
    fields = fields_of(cls)
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(source, dotted, _unknown_key(str(key), fields))
        out[key] = _field_value(fields[key], hints[key], value, source, dotted)
    return out


def _unknown_key(key: str, known: Iterable[str]) -> str:
    """What to say about ``key``: the known key it was most likely meant to be first (a typo among two
    dozen names is hard to spot in a list), then all of them."""
    names = sorted(known)
    near = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
    hint = f", did you mean {near[0]!r}?" if near else ""
    return f"unknown key{hint} (expected one of: {', '.join(names)})"


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
    if not math.isfinite(value):  # every comparison below is false for NaN
        return f"expected a finite number, got {value!r}"
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
        return build(tp, value, source, key)
    return _scalar(tp, value, source, key)


def _byte_size(_tp: Any, value: Any, source: str, key: str) -> ByteSize:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(source, key, f"expected a byte size (integer or '10GiB'), got {describe(value)}")
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
        raise ConfigError(source, key, f"expected 'host:port' or a list of them, got {describe(value)}")
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
        raise ConfigError(source, key, f"expected a table or an array of tables, got {describe(value)}")
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
        raise ConfigError(source, key, f"expected a table of [{key}.NAME] tables, got {describe(value)}")
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
                f"expected a table (importance, durability, protected), got {describe(given)}",
            )
        base = plain_value(table.get(name, ClassSettings()))
        table[name] = build(ClassSettings, {**base, **given}, source, dotted)
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
            raise ConfigError(source, key, f"expected true or false, got {describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, f"expected an integer, got {describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(source, key, f"expected a number, got {describe(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(source, key, f"expected a string, got {describe(value)}")
        return value
    raise ConfigError(source, key, f"unsupported type {tp!r} in schema")


def describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {value!r}"


def plain_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: plain_value(getattr(value, name)) for name in fields_of(type(value))}
    if isinstance(value, Mapping):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain_value(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bool):
        return value
    return int(value) if isinstance(value, int) else value


__all__ = [
    "build",
    "check_value",
    "coerced",
    "describe",
    "fields_of",
    "plain_value",
    "run_validate",
    "settings_from_dict",
]
