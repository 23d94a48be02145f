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
at most :data:`MAX_DEPTH` blocks, at most :data:`MAX_WALK` blocks walked per call over all chains, and at
most :data:`~tierkv.limits.MAX_HOTTEST_REPLY_BYTES` of keys and token ids per reply. Chains past a bound
are left out (the hottest are kept) and the reply says it was truncated; a chain of any length that fits
is answered whole, token ids and all (a long prompt's warm start).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from tierkv.limits import MAX_HOTTEST_REPLY_BYTES
from tierkv.vault.store import DEFAULT_TENANT, ChainEntry, Store

DEFAULT_LIMIT = 32
MAX_LIMIT = 1024
MAX_SCAN = 200_000
"""Index records read per call: a namespace larger than this is judged by its first ``MAX_SCAN`` keys."""
MAX_DEPTH = 16_384
MAX_WALK = 1 << 20
"""Blocks walked per call, over all chains (a deep chain reported 1,024 times is walked once per chain)."""
KEY_OVERHEAD = 4
"""Bytes a key costs in a reply on top of its own (protobuf tag and length)."""


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


def walk(
    end: ChainEntry, by_key: dict[bytes, ChainEntry], max_blocks: int = MAX_DEPTH
) -> tuple[list[ChainEntry], bool]:
    """The chain from its root to ``end`` (at most ``max_blocks`` of it), and whether it reached a root (a
    block without a parent)."""
    chain = [end]
    seen = {end.key}
    while chain[-1].parent and len(chain) < min(max_blocks, MAX_DEPTH):
        parent = by_key.get(chain[-1].parent)
        if parent is None or parent.key in seen:
            break
        seen.add(parent.key)
        chain.append(parent)
    chain.reverse()
    return chain, not chain[0].parent


@dataclasses.dataclass
class Hottest:
    """The chains of one reply, and whether bounds left some out."""

    chains: list[HotChain] = dataclasses.field(default_factory=list)
    truncated: bool = False


def hottest(
    store: Store, namespace: bytes, *, tenant: str = DEFAULT_TENANT, limit: int = DEFAULT_LIMIT
) -> Hottest:
    """The ``limit`` hottest chains of ``namespace`` (0: :data:`DEFAULT_LIMIT`; capped at
    :data:`MAX_LIMIT`), hottest first, within the bounds of the module docstring."""
    limit = min(limit or DEFAULT_LIMIT, MAX_LIMIT)
    entries = store.chain_entries(namespace, tenant=tenant, limit=MAX_SCAN)
    by_key = {e.key: e for e in entries}
    out = Hottest()
    reply_bytes, walk_left = MAX_HOTTEST_REPLY_BYTES, MAX_WALK
    read: dict[bytes, bytes] = {}
    for end in chain_ends(entries):
        if len(out.chains) >= limit:
            break
        if walk_left <= 0:
            out.truncated = True
            break
        chain, rooted = walk(end, by_key, walk_left)
        walk_left -= len(chain)
        if walk_left <= 0 and not rooted:
            out.truncated = True  # the walk ran out before this chain's root
            break
        keys = [e.key for e in chain]
        size = sum(len(k) + KEY_OVERHEAD for k in keys)
        if size > reply_bytes:
            out.truncated = True
            break
        tokens = _tokens(store, namespace, keys, tenant, read) if rooted else b""
        size += len(tokens)
        if size > reply_bytes:
            out.truncated = True
            break
        reply_bytes -= size
        out.chains.append(HotChain(tuple(keys), end.hits, chain[0].source, tokens))
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


__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "MAX_SCAN",
    "MAX_WALK",
    "HotChain",
    "Hottest",
    "chain_ends",
    "hottest",
    "walk",
]
