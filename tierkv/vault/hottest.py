"""Hottest: a namespace's most-hit chains, walked root-first, with the token ids a warm start replays.

Every entry stored with retention metadata names its parent, so the stored entries of a namespace form a
prefix forest. A chain *ends* at an entry with hits none of whose children has any (or, for entries never
hit, at a leaf): a shared system prompt hit often but continued by one-off conversations is reported as
itself, a conversation hit again as the whole conversation — the longest prefix that is actually reused.
Chains are ordered by the decayed hits of their last block, then by recency, and walked to their root
through parent keys.

A chain is replayable only when it starts at a root (a block stored without a parent) and every block
carries its token ids; otherwise its ``tokens`` are empty (a block stored without ids, a prefix already
evicted, or — with several vaults sharding one namespace — a parent held by another vault: each vault
walks only what it holds).

The work is bounded: at most :data:`MAX_SCAN` index records read (in short read transactions, see
:meth:`Store.chain_entries <tierkv.vault.store.Store.chain_entries>`), at most :data:`MAX_LIMIT` chains of
at most :data:`MAX_DEPTH` blocks, and at most :data:`MAX_REPLY_TOKEN_BYTES` of token ids per reply (chains
past it are left out, hottest kept).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from tierkv.vault.store import DEFAULT_TENANT, ChainEntry, Store

DEFAULT_LIMIT = 32
MAX_LIMIT = 1024
MAX_SCAN = 200_000
"""Index records read per call: a namespace larger than this is judged by its first ``MAX_SCAN`` keys."""
MAX_DEPTH = 16_384
MAX_REPLY_TOKEN_BYTES = 16 * 1024 * 1024
"""Token ids in one reply (a quarter of the gRPC message limit)."""


@dataclasses.dataclass(frozen=True)
class HotChain:
    """One chain: keys root first, the last block's decayed hits, the first block's class, and the
    chain's token ids (packed int32, empty when it cannot be replayed)."""

    keys: tuple[bytes, ...]
    hits: float
    source: str
    tokens: bytes


def chain_ends(entries: Iterable[ChainEntry]) -> list[ChainEntry]:
    """The entries chains end at (see the module docstring), hottest first, then most recent."""
    listed = list(entries)
    parents = {e.parent for e in listed if e.parent}
    hot_parents = {e.parent for e in listed if e.parent and e.hits > 0}
    ends = [e for e in listed if (e.key not in hot_parents if e.hits > 0 else e.key not in parents)]
    ends.sort(key=lambda e: (e.hits, e.clock), reverse=True)
    return ends


def walk(end: ChainEntry, by_key: dict[bytes, ChainEntry]) -> tuple[list[ChainEntry], bool]:
    """The chain from its root to ``end``, and whether it reached a root (a block without a parent)."""
    chain = [end]
    seen = {end.key}
    while chain[-1].parent and len(chain) < MAX_DEPTH:
        parent = by_key.get(chain[-1].parent)
        if parent is None or parent.key in seen:
            break
        seen.add(parent.key)
        chain.append(parent)
    chain.reverse()
    return chain, not chain[0].parent


def hottest(
    store: Store, namespace: bytes, *, tenant: str = DEFAULT_TENANT, limit: int = DEFAULT_LIMIT
) -> list[HotChain]:
    """The ``limit`` hottest chains of ``namespace`` (0: :data:`DEFAULT_LIMIT`; capped at
    :data:`MAX_LIMIT`), hottest first."""
    limit = min(limit or DEFAULT_LIMIT, MAX_LIMIT)
    entries = store.chain_entries(namespace, tenant=tenant, limit=MAX_SCAN)
    by_key = {e.key: e for e in entries}
    out: list[HotChain] = []
    budget = MAX_REPLY_TOKEN_BYTES
    read: dict[bytes, bytes] = {}
    for end in chain_ends(entries):
        if len(out) >= limit:
            break
        chain, rooted = walk(end, by_key)
        keys = [e.key for e in chain]
        tokens = _tokens(store, namespace, keys, tenant, read) if rooted else b""
        if len(tokens) > budget:
            break
        budget -= len(tokens)
        out.append(HotChain(tuple(keys), end.hits, chain[0].source, tokens))
    return out


def _tokens(
    store: Store, namespace: bytes, keys: Sequence[bytes], tenant: str, read: dict[bytes, bytes]
) -> bytes:
    """The chain's token ids, or nothing when a block lacks them. ``read`` keeps the ids already read
    (empty: none stored), so a prefix many chains share is read once."""
    missing = [k for k in keys if k not in read]
    if missing:
        read.update(
            zip(missing, (p or b"" for p in store.tokens_of(namespace, missing, tenant=tenant)), strict=True)
        )
    parts = [read[k] for k in keys]
    return b"".join(parts) if all(parts) else b""


__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "MAX_SCAN", "HotChain", "chain_ends", "hottest", "walk"]
