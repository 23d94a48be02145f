"""The configuration reference page, generated from the settings schema so it cannot drift.

Keys, types, defaults and bounds come from the frozen dataclasses of :mod:`tierkv.config` (and the engine
hooks' settings classes); each key's description is the comment above it in ``tierkv.toml.example``, the
file ``tierkv config init`` writes. A key of the schema that the example file does not document is an
error, so a new setting cannot ship undocumented. The documentation build runs this (the ``mkdocs`` hook
in ``scripts/docs_hooks.py``); ``python scripts/config_reference.py`` prints the page.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tierkv.config import (  # noqa: E402
    Addresses,
    ByteSize,
    ClassSettings,
    ClassTable,
    Config,
    Endpoint,
    format_size,
)
from tierkv.connectors.vllm.settings import ConnectorSettings  # noqa: E402
from tierkv.tiering.checks import SessionSettings  # noqa: E402

EXAMPLE = ROOT / "tierkv" / "data" / "tierkv.toml.example"
_HEADER = re.compile(r"^#?\s?\[\[?([\w.]+)\]\]?\s*$")
_KEY = re.compile(r"^(?:# )?(\w+) = ")


class Undocumented(Exception):
    """A schema key has no comment in the example file."""


def example_comments(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """Per dotted key and per section, the comment block that stands above it in the example file.

    A comment block describes every key that follows it until the next block (``bulk`` and ``bulk_port``
    share one); a block right above a section header describes the section.
    """
    keys: dict[str, str] = {}
    sections: dict[str, str] = {}
    section, pending, current = "", [], ""
    for line in text.splitlines():
        header, key = _HEADER.match(line), _KEY.match(line)
        if header:
            section = header.group(1)
            sections[section] = " ".join(pending)
            pending, current = [], ""
        elif key and section:
            if pending:
                current, pending = " ".join(pending), []
            keys[f"{section}.{key.group(1)}"] = current
        elif line.startswith("#"):
            pending.append(line.lstrip("#").strip())
        elif not line.strip() and pending and not section:
            pending = []
    return keys, sections


def type_name(hint: Any) -> str:
    """How a setting's type reads in the reference."""
    if get_origin(hint) is Literal:
        return ", ".join(f'`"{a}"`' for a in get_args(hint))
    if hint is ByteSize:
        return 'size (bytes, or `"8GiB"`)'
    if hint is Addresses:
        return '`"host:port"`, a list, or comma-separated'
    if get_origin(hint) in (typing.Union, getattr(types, "UnionType", None)):
        return " or ".join(type_name(a) for a in get_args(hint) if a is not type(None)) + " (optional)"
    if isinstance(hint, type) and hasattr(hint, "__members__"):
        return ", ".join(f'`"{m.value}"`' for m in hint.__members__.values())
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(hint, str(hint))


def default_text(value: Any) -> str:
    if isinstance(value, ByteSize):
        return f'`"{format_size(value)}"`'
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ", ".join(f"`{v.address if isinstance(v, Endpoint) else v}`" for v in value) or "none"
    if hasattr(value, "value"):
        return f'`"{value.value}"`'
    return f"`{value}`"


def bounds_text(meta: typing.Mapping[str, Any], size: bool = False) -> str:
    def shown(n: float) -> str:
        return f'`"{format_size(int(n))}"`' if size and n else f"{n:g}"

    parts = []
    if meta.get("choices"):
        parts.append("one of " + ", ".join(f"`{c}`" for c in meta["choices"]))
    if meta.get("positive"):
        parts.append("> 0")
    if meta.get("minimum") is not None:
        parts.append(f"≥ {shown(meta['minimum'])}")
    if meta.get("maximum") is not None:
        parts.append(f"≤ {shown(meta['maximum'])}")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(cls: type, prefix: str) -> Iterator[tuple[str, dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("internal"):
            yield f"{prefix}{f.name}", f, hints[f.name]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def key_table(cls: type, default_title: str = "default") -> Iterator[str]:
    """The keys of ``cls`` as a table: key, type, default, allowed values."""
    yield f"| key | type | {default_title} | allowed |"
    yield "|---|---|---|---|"
    for _, f, hint in _rows(cls, ""):
        row = (f"`{f.name}`", type_name(hint), default_text(_default(f)), bounds_text(f.metadata))
        yield "| " + " | ".join(_cell(c) for c in row) + " |"
    yield ""


def section_tables(cls: type, name: str, keys: dict[str, str], sections: dict[str, str]) -> Iterator[str]:
    """Markdown for ``[name]`` and its sub-tables, depth first."""
    rows: list[str] = []
    subs: list[tuple[Any, str]] = []
    previous = ("", "")
    for dotted, f, hint in _rows(cls, f"{name}."):
        default = _default(f)
        if dataclasses.is_dataclass(hint):
            subs.append((hint, dotted))
            continue
        if hint is ClassTable or get_args(hint)[:1] == (Endpoint,):
            subs.append((hint, dotted))
            continue
        if dotted not in keys:
            raise Undocumented(f"{dotted}: not documented in {EXAMPLE.name}")
        what = keys[dotted]
        if what and what == previous[1]:
            shown = f"(see `{previous[0]}` above)"
        else:
            previous, shown = (f.name, what), what
        size = hint is ByteSize
        row = (f"`{f.name}`", type_name(hint), default_text(default), bounds_text(f.metadata, size), shown)
        rows.append("| " + " | ".join(_cell(c) for c in row) + " |")
    yield f"## `[{name}]`"
    yield ""
    if sections.get(name):
        yield sections[name]
        yield ""
    if rows:
        yield "| key | type | default | allowed | what it does |"
        yield "|---|---|---|---|---|"
        yield from rows
        yield ""
    for hint, dotted in subs:
        if hint is ClassTable:
            yield from class_table(dotted, sections)
        elif dataclasses.is_dataclass(hint):
            yield from section_tables(hint, dotted, keys, sections)
        else:
            yield from endpoint_table(dotted, sections)


def endpoint_table(name: str, sections: dict[str, str]) -> Iterator[str]:
    default = _default(
        next(f for f in dataclasses.fields(Config().cluster) if f.name == name.rsplit(".", maxsplit=1)[-1])
    )
    yield f"## `[{name}]` / `[[{name}]]`"
    yield ""
    if sections.get(name):
        yield sections[name]
        yield ""
    yield f"Default: {default_text(default)}. Each vault is a table of:"
    yield ""
    yield from key_table(Endpoint)


def class_table(name: str, sections: dict[str, str]) -> Iterator[str]:
    doc = next((v for k, v in sections.items() if k.startswith(f"{name}.")), "")
    yield f"## `[{name}.NAME]`"
    yield ""
    if doc:
        yield doc
        yield ""
    yield from key_table(ClassSettings, "default (a new class)")
    yield "The built-in classes:"
    yield ""
    yield "| class | importance | durability | protected |"
    yield "|---|---|---|---|"
    for cls_name, c in Config().retention.classes.items():
        yield f"| `{cls_name}` | {c.importance:g} | `{c.durability.value}` | {str(c.protected).lower()} |"
    yield ""


def hook_table(title: str, cls: type, intro: str) -> Iterator[str]:
    yield f"## {title}"
    yield ""
    yield intro
    yield ""
    yield from key_table(cls)


def render() -> str:
    """The reference as Markdown (no page title: the page around it has one)."""
    keys, sections = example_comments(EXAMPLE.read_text())
    out: list[str] = []
    for _, f, hint in _rows(Config, ""):
        out.extend(section_tables(hint, f.name, keys, sections))
    out.extend(
        hook_table(
            "vLLM: `kv_connector_extra_config`",
            ConnectorSettings,
            "Inline keys of `TierKVConnector`, checked by the same rules as tierkv.toml. `kv_cold`, "
            "`ssm_cold` and `timeout` default to the `[cluster]` values of the file `config_path` names "
            "(or the usual search order). tierkv 0.1's keys are mapped: `kv_cold_host` + `kv_cold_port` "
            "(and the `ssm_cold` pair) become `kv_cold`, `turbo_quant` becomes `codec`, and `kv_dim`, "
            "`block_size`, `max_inflight_promotes` are ignored with a warning each.",
        )
    )
    out.extend(
        hook_table(
            "transformers: `TieredSession(...)` keyword arguments",
            SessionSettings,
            "Checked by the same rules as tierkv.toml; a bad value is a `ConfigError` naming the key.",
        )
    )
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
