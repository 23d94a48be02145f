"""``tierkv snapshot``: the hottest prefixes of every tenant and namespace on the kv_cold vaults, as JSON.

Each vault is asked for its namespaces (a user token: its own tenant's; an admin token: every tenant's)
and, per namespace, for its hottest chains (``Hottest``). Chains held by several vaults (replicas) count
once. Only chains that come with token ids can be replayed; the others are counted as ``skipped`` (their
blocks were stored without ids: ``[retention] warm_tokens`` was off, or the prefix is gone).

The file (``version`` 1)::

    {"format": "tierkv-snapshot", "version": 1, "created": "2026-…Z", "skipped": 0,
     "prefixes": [{"tenant": "default", "namespace": "<hex>", "hits": 12.0, "source": "axioms",
                   "blocks": 4, "tokens": [1, 2, …]}, …]}

:func:`load_snapshot` reads it back and checks every field (:class:`SnapshotError` names the file, the
entry and the field).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tierkv.client.fanout import Answer, ask, targets
from tierkv.client.vault import VaultClient
from tierkv.config import Config
from tierkv.limits import MAX_NAMESPACE_BYTES
from tierkv.records import HotChain
from tierkv.roles import Role

FORMAT = "tierkv-snapshot"
VERSION = 1
MAX_TOKEN_ID = 2**31 - 1


class SnapshotError(ValueError):
    """A snapshot file is unreadable or malformed: names the file, the entry and the field."""


@dataclasses.dataclass(frozen=True)
class Prefix:
    """One prefix to replay: whose, which namespace, how hot, its first block's class, its token ids."""

    tenant: str
    namespace: bytes
    hits: float
    source: str
    blocks: int
    tokens: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "namespace": self.namespace.hex(),
            "hits": self.hits,
            "source": self.source,
            "blocks": self.blocks,
            "tokens": list(self.tokens),
        }


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The prefixes, hottest first; ``skipped``: hot chains without token ids; ``errors``: one line per
    vault that did not answer."""

    prefixes: list[Prefix]
    created: str = ""
    skipped: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "created": self.created,
            "skipped": self.skipped,
            "prefixes": [p.to_dict() for p in self.prefixes],
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")


Found = list[tuple[str, bytes, HotChain]]


def _vault_hottest(client: VaultClient, tenant: str, limit: int) -> Found:
    """(tenant, namespace, chain) of every namespace this vault lets the token see."""
    namespaces, _ = client.list_namespaces(tenant=tenant)
    return [
        (n.tenant, n.namespace, chain)
        for n in namespaces
        for chain in client.hottest(n.namespace, limit=limit, tenant=n.tenant)
    ]


def take_snapshot(
    config: Config,
    *,
    vaults: Sequence[str] = (),
    tenant: str = "",
    limit: int = 32,
    timeout: float = 30.0,
) -> Snapshot:
    """The ``limit`` hottest replayable prefixes per tenant and namespace on the kv_cold vaults of
    ``config`` (or on ``vaults``), hottest first."""
    where = [t for t in targets(config, vaults) if t.role in ("", str(Role.KV_COLD))]
    answers = ask(config, where, lambda c: _vault_hottest(c, tenant, limit), timeout)
    return merge(answers, limit)


def merge(answers: Sequence[Answer[Found]], limit: int) -> Snapshot:
    """One entry per (tenant, namespace, chain), the highest hits any vault gave; replayable ones kept."""
    best: dict[tuple[str, bytes, tuple[bytes, ...]], tuple[float, HotChain]] = {}
    for a in answers:
        for tenant, namespace, chain in a.value or []:
            key = (tenant, namespace, chain.keys)
            if key not in best or chain.hits > best[key][0]:
                best[key] = (chain.hits, chain)
    kept: dict[tuple[str, bytes], list[Prefix]] = {}
    skipped = 0
    for (tenant, namespace, keys), (hits, chain) in best.items():
        if not chain.tokens:
            skipped += 1
            continue
        prefix = Prefix(tenant, namespace, hits, chain.source, len(keys), chain.tokens)
        kept.setdefault((tenant, namespace), []).append(prefix)
    prefixes = [p for group in kept.values() for p in sorted(group, key=_hotness)[:limit]]
    errors = [f"{a.target.address}: {a.error}" for a in answers if a.error is not None]
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return Snapshot(sorted(prefixes, key=_hotness), created, skipped, errors)


def _hotness(p: Prefix) -> tuple[float, int]:
    return (-p.hits, -len(p.tokens))


def load_snapshot(path: str | Path) -> Snapshot:
    """A snapshot file, every field checked; :class:`SnapshotError` says what is wrong and where."""
    where = str(path)
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(f"{where}: not a readable JSON file ({exc})") from None
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        raise SnapshotError(f'{where}: not a tierkv snapshot (expected "format": "{FORMAT}")')
    if doc.get("version") != VERSION:
        raise SnapshotError(f"{where}: version {doc.get('version')!r}, this tierkv reads version {VERSION}")
    entries = doc.get("prefixes")
    if not isinstance(entries, list):
        raise SnapshotError(f"{where}: prefixes: expected a list")
    prefixes = [_prefix(e, f"{where}: prefixes[{i}]") for i, e in enumerate(entries)]
    skipped = doc.get("skipped", 0)
    return Snapshot(prefixes, str(doc.get("created", "")), skipped if isinstance(skipped, int) else 0)


def _prefix(entry: object, where: str) -> Prefix:
    if not isinstance(entry, Mapping):
        raise SnapshotError(f"{where}: expected an object")
    tenant, source = _field(entry, "tenant", str, where), _field(entry, "source", str, where)
    try:
        namespace = bytes.fromhex(_field(entry, "namespace", str, where))
    except ValueError:
        raise SnapshotError(f"{where}.namespace: expected hex digits") from None
    if len(namespace) > MAX_NAMESPACE_BYTES:
        raise SnapshotError(f"{where}.namespace: longer than {MAX_NAMESPACE_BYTES} bytes")
    hits = _field(entry, "hits", (int, float), where)
    blocks = _field(entry, "blocks", int, where)
    tokens = _field(entry, "tokens", list, where)
    if not math.isfinite(hits) or hits < 0 or blocks < 0:
        raise SnapshotError(f"{where}: hits and blocks must be non-negative numbers")
    if not tokens or not all(_is_id(t) for t in tokens):
        raise SnapshotError(f"{where}.tokens: expected a non-empty list of token ids (integers >= 0)")
    return Prefix(tenant, namespace, float(hits), source, blocks, tuple(tokens))


def _field(entry: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise SnapshotError(f"{where}.{name}: missing or of the wrong type")
    return value


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


__all__ = [
    "FORMAT",
    "VERSION",
    "Prefix",
    "Snapshot",
    "SnapshotError",
    "load_snapshot",
    "merge",
    "take_snapshot",
]
