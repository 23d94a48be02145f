"""``tierkv admin``: what an operator asks running vaults — their namespaces, one entry, a flush.

Every command asks each vault of tierkv.toml (or the ``--vault`` addresses) in parallel, with the token
and TLS of the config. The vault decides what the token may see: a ``user`` lists and inspects its own
tenant's namespaces, an ``admin`` every tenant's, and only an admin flushes every namespace.

A namespace is a digest (of model, dtype, layout, codec, ranks, tenant and salt): the vault cannot say
which model it belongs to. What it can show is the header of a sample blob — codec, dtype, shape, tokens
per block and layer group — which is what the listing prints beside the hex.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any, TypeVar

from rich.table import Table

from tierkv.client.fanout import Answer, Target, ask, targets
from tierkv.client.types import EntryInfo, NamespaceInfo, blob_header
from tierkv.config import human_bytes
from tierkv.errors import CodecError, ConfigError

T = TypeVar("T")
UNKNOWN_MODEL = "unknown: the namespace is a digest"


def parse_hex(value: str, what: str) -> bytes:
    """A namespace or key given as hex on the command line."""
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ConfigError("command line", what, f"expected hex digits, got {value!r}") from None


# -- what a blob head says -----------------------------------------------------------------------------


def describe_head(head: bytes) -> dict[str, Any]:
    """The blob header at the start of ``head`` as plain values, or why there is none."""
    if not head:
        return {"error": "empty blob"}
    try:
        h = blob_header(head)
    except CodecError as exc:
        return {"error": f"not a readable tierkv blob: {exc}"}
    return {
        "codec": h.codec,
        "dtype": h.dtype,
        "shape": list(h.shape),
        "tokens": h.tokens,
        "layer_group": h.layer_group.name.lower(),
        "blob_bytes": h.blob_len,
    }


def head_summary(head: bytes) -> str:
    d = describe_head(head)
    if "error" in d:
        return str(d["error"])
    shape = "×".join(map(str, d["shape"]))
    return f"{d['codec']} {d['dtype']} {d['layer_group']}, {d['tokens']} tokens, [{shape}]"


# -- namespaces ----------------------------------------------------------------------------------------


Listing = tuple[list[NamespaceInfo], bool]


def namespace_dict(n: NamespaceInfo) -> dict[str, Any]:
    return {
        "tenant": n.tenant,
        "namespace": n.namespace.hex(),
        "model": None,
        "keys": n.keys,
        "bytes": n.used_bytes,
        "protected_bytes": n.protected_bytes,
        "sample_key": n.sample_key.hex(),
        "blob": describe_head(n.head),
    }


def namespaces_doc(answers: Sequence[Answer[Listing]]) -> dict[str, Any]:
    vaults = []
    for a in answers:
        if a.value is None:
            vaults.append(a.error_dict())
            continue
        found, truncated = a.value
        vaults.append(
            {
                "role": a.target.role,
                "vault": a.target.address,
                "truncated": truncated,
                "namespaces": [namespace_dict(n) for n in found],
            }
        )
    return {"model_note": UNKNOWN_MODEL, "vaults": vaults}


def namespaces_table(answers: Sequence[Answer[Listing]], title: str) -> Table:
    table = Table(title=title)
    for col in ("vault", "tenant", "namespace (hex)", "model"):
        table.add_column(col, overflow="fold")
    for col in ("keys", "bytes", "protected"):
        table.add_column(col, justify="right")
    table.add_column("blocks (sample header)", overflow="fold")
    for a in answers:
        if a.value is None:
            continue
        found, truncated = a.value
        for n in found:
            table.add_row(
                a.target.address,
                n.tenant,
                n.namespace.hex() or "(empty)",
                "?",
                f"{n.keys:,}",
                human_bytes(n.used_bytes),
                human_bytes(n.protected_bytes) if n.protected_bytes else "",
                head_summary(n.head),
            )
        if truncated:
            table.add_row(a.target.address, "…", "more namespaces than listed", *[""] * 5)
    return table


# -- one entry -----------------------------------------------------------------------------------------


def entry_dict(e: EntryInfo) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "status": e.status.value,
        "tenant": e.tenant,
        "size": e.size,
        "charge": e.charge,
        "priority": e.priority,
        "blob": describe_head(e.head) if e.head else None,
        "retention": None,
    }
    if e.has_meta:
        doc["retention"] = {
            "class": e.source,
            "importance": e.importance,
            "protected": e.protected,
            "expiry": e.expiry or None,
            "expired": e.expired,
            "hits": e.hits,
            "children": e.children,
            "parent": e.parent.hex(),
        }
    return doc


def inspect_doc(namespace: bytes, key: bytes, answers: Sequence[Answer[EntryInfo]]) -> dict[str, Any]:
    vaults = [
        a.error_dict()
        if a.value is None
        else {"role": a.target.role, "vault": a.target.address, **entry_dict(a.value)}
        for a in answers
    ]
    return {"namespace": namespace.hex(), "key": key.hex(), "vaults": vaults}


def entry_lines(e: EntryInfo) -> list[str]:
    """One entry, as ``name: value`` lines."""
    if e.status.value == "missing":
        return ["status: missing"]
    lines = [
        f"status: {e.status.value}",
        f"tenant: {e.tenant}",
        f"size: {e.size:,} bytes (charged {e.charge:,}), priority {e.priority}",
        f"blob: {head_summary(e.head)}",
    ]
    if not e.has_meta:
        return [*lines, "retention: none (stored untagged)"]
    return [
        *lines,
        f"class: {e.source or '(untagged)'}",
        f"importance: {e.importance:g}",
        f"protected: {'yes' if e.protected else 'no'}",
        f"expiry: {_expiry(e)}",
        f"hits (decayed): {e.hits:g}",
        f"children: {e.children}",
        f"parent: {e.parent.hex() or '(first block of its chain)'}",
    ]


def _expiry(e: EntryInfo) -> str:
    if not e.expiry:
        return "never"
    when = datetime.datetime.fromtimestamp(e.expiry, tz=datetime.timezone.utc).isoformat(timespec="seconds")
    return f"{when} (expired)" if e.expired else when


__all__ = [
    "Answer",
    "Target",
    "ask",
    "describe_head",
    "entry_lines",
    "inspect_doc",
    "namespaces_doc",
    "namespaces_table",
    "parse_hex",
    "targets",
]
