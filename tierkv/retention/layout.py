"""Prompt layout → per-block metadata.

An application describes a prompt as ordered chunks — token spans (``{"tokens": [0, 512], "source":
"axioms", "priority": 5}``) or character spans mapped through the tokenizer's offsets (``{"chars": [0,
2048], …}``) — and tierkv tags each stored block from the chunks it overlaps. A block spanning two chunks
takes the more protective one (pinned, then longer durability, then higher importance), so a boundary that
does not fall on a block edge never weakens an important chunk. Tokens no chunk covers stay untagged.

:func:`block_meta` is the whole path for anyone driving the vaults directly: layout in, metadata keyed by
block key out, ready for ``Cluster.put(..., meta=...)`` or ``ColdTier.store(..., meta=...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tierkv.retention.classes import (
    UNTAGGED,
    BlockMeta,
    Durability,
    Retention,
    check_importance,
    importance_of_priority,
)

GENERATION = "generation"
"""The source class of tokens a model generated past its prompt (when the prompt came with a layout)."""
_KEYS = frozenset({"tokens", "chars", "source", "importance", "priority", "durability", "protected"})
MAX_CHUNKS = 4096


class LayoutError(ValueError):
    """A layout entry is malformed: names the entry and the field."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Tokens ``[start, stop)`` of a prompt and what they are to the application."""

    start: int
    stop: int
    source: str = ""
    importance: float | None = None
    durability: Durability | None = None
    protected: bool | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop:
            raise LayoutError(f"token span [{self.start}, {self.stop}) is not a span")
        if self.importance is not None:
            check_importance(self.importance)


def parse_layout(
    entries: object, *, offsets: Sequence[tuple[int, int]] | None = None, where: str = "layout"
) -> list[Chunk]:
    """Chunks from a JSON-like list (as sent in ``kv_transfer_params``); :class:`LayoutError` names the
    bad entry. ``offsets`` (one ``(char_start, char_end)`` per token) is needed for ``chars`` spans."""
    if not isinstance(entries, Sequence) or isinstance(entries, str | bytes):
        raise LayoutError(f"{where}: expected a list of chunks, got {type(entries).__name__}")
    if len(entries) > MAX_CHUNKS:
        raise LayoutError(f"{where}: more than {MAX_CHUNKS} chunks")
    return [_chunk(entry, offsets, f"{where}[{i}]") for i, entry in enumerate(entries)]


def _chunk(entry: object, offsets: Sequence[tuple[int, int]] | None, where: str) -> Chunk:
    if not isinstance(entry, Mapping):
        raise LayoutError(f"{where}: expected an object, got {type(entry).__name__}")
    unknown = set(entry) - _KEYS
    if unknown:
        raise LayoutError(f"{where}: unknown field(s) {sorted(map(str, unknown))}")
    start, stop = _span(entry, offsets, where)
    try:
        return Chunk(
            start,
            stop,
            source=_typed(entry, "source", str, where) or "",
            importance=_importance(entry, where),
            durability=_durability(entry, where),
            protected=_typed(entry, "protected", bool, where),
        )
    except ValueError as exc:
        raise LayoutError(f"{where}: {exc}") from None


def _span(entry: Mapping[str, Any], offsets: Sequence[tuple[int, int]] | None, where: str) -> tuple[int, int]:
    if ("tokens" in entry) == ("chars" in entry):
        raise LayoutError(f"{where}: give exactly one of 'tokens' or 'chars'")
    field = "tokens" if "tokens" in entry else "chars"
    span = entry[field]
    ok = isinstance(span, Sequence) and len(span) == 2 and all(_is_int(x) for x in span)
    if not ok or not 0 <= span[0] <= span[1]:
        raise LayoutError(f"{where}.{field}: expected [start, stop] with 0 <= start <= stop, got {span!r}")
    if field == "tokens":
        return int(span[0]), int(span[1])
    if offsets is None:
        raise LayoutError(f"{where}.chars: character spans need the tokenizer's offsets")
    return token_span(offsets, int(span[0]), int(span[1]))


def token_span(offsets: Sequence[tuple[int, int]], char_start: int, char_stop: int) -> tuple[int, int]:
    """The tokens whose characters overlap ``[char_start, char_stop)`` (an empty span if none do)."""
    hit = [i for i, (s, e) in enumerate(offsets) if s < char_stop and e > char_start]
    return (hit[0], hit[-1] + 1) if hit else (0, 0)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _typed(entry: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = entry.get(key)
    if value is not None and not isinstance(value, kind):
        raise LayoutError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def _importance(entry: Mapping[str, Any], where: str) -> float | None:
    if "importance" in entry and "priority" in entry:
        raise LayoutError(f"{where}: give 'importance' or 'priority', not both")
    if entry.get("priority") is not None:
        return importance_of_priority(entry["priority"])
    value = entry.get("importance")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LayoutError(f"{where}.importance: expected a number in [0, 1], got {value!r}")
    return float(value)


def _durability(entry: Mapping[str, Any], where: str) -> Durability | None:
    value = entry.get("durability")
    if value is None:
        return None
    try:
        return Durability(value)
    except ValueError:
        choices = ", ".join(d.value for d in Durability)
        raise LayoutError(f"{where}.durability: expected one of {choices}, got {value!r}") from None


def tag_blocks(
    chunks: Sequence[Chunk],
    n_blocks: int,
    block_size: int,
    retention: Retention | None = None,
    *,
    tokens: Sequence[int] | None = None,
) -> list[BlockMeta]:
    """Metadata of each of the first ``n_blocks`` full blocks: the most protective overlapping chunk's,
    with the block's own ids out of ``tokens`` (the chain's token ids) when they are given."""
    rules = retention or Retention()
    metas = [
        rules.meta(c.source, importance=c.importance, durability=c.durability, protected=c.protected)
        for c in chunks
    ]
    out: list[BlockMeta] = []
    for b in range(n_blocks):
        lo, hi = b * block_size, (b + 1) * block_size
        over = [m for c, m in zip(chunks, metas, strict=True) if c.start < hi and c.stop > lo]
        meta = max(over, key=BlockMeta.protection) if over else UNTAGGED
        if tokens is not None:
            meta = dataclasses.replace(meta, tokens=tuple(tokens[lo:hi]))
        out.append(meta)
    return out


def with_parents(
    metas: Sequence[BlockMeta], keys: Sequence[bytes], first_parent: bytes = b""
) -> list[BlockMeta]:
    """The same metadata with each block's ``parent`` set to the key before it in the chain (no blocks,
    no metadata: a prompt shorter than one block has neither)."""
    parents = [first_parent, *keys[:-1]][: len(keys)]
    return [dataclasses.replace(m, parent=p) for m, p in zip(metas, parents, strict=True)]


Layout = Sequence[Chunk] | Sequence[Mapping[str, Any]]
"""Chunks, or their JSON-like form (what :func:`parse_layout` reads)."""


def as_chunks(layout: Layout | object, offsets: Sequence[tuple[int, int]] | None = None) -> list[Chunk]:
    """``layout`` as chunks: parsed (:class:`LayoutError` on a bad entry) unless it already is."""
    if isinstance(layout, Sequence) and all(isinstance(c, Chunk) for c in layout):
        return list(layout)
    return parse_layout(layout, offsets=offsets)


def with_generation(chunks: Sequence[Chunk], prompt_tokens: int, total_tokens: int) -> list[Chunk]:
    """``chunks`` and one more for the tokens after the prompt, of class :data:`GENERATION`."""
    if total_tokens <= prompt_tokens:
        return list(chunks)
    return [*chunks, Chunk(prompt_tokens, total_tokens, GENERATION)]


def keyed(
    metas: Sequence[BlockMeta], keys: Sequence[bytes], first_parent: bytes = b""
) -> dict[bytes, BlockMeta]:
    """Per-block metadata keyed by block key, each with the key before it in the chain as its parent."""
    return dict(zip(keys, with_parents(metas, keys, first_parent), strict=True))


def block_meta(
    keys: Sequence[bytes],
    layout: Layout,
    block_size: int,
    retention: Retention | None = None,
    *,
    offsets: Sequence[tuple[int, int]] | None = None,
    prompt_tokens: int | None = None,
    first_parent: bytes = b"",
    tokens: Sequence[int] | None = None,
) -> dict[bytes, BlockMeta]:
    """The metadata of the blocks ``keys`` (one chain, block ``i`` holding tokens ``[i*block_size,
    (i+1)*block_size)``) under ``layout``: tag_blocks + with_parents, keyed by block key.

    Every block gets an entry, so the vault learns the whole chain; blocks no chunk covers stay untagged
    but keep their parent. With ``prompt_tokens`` the tokens from there on are tagged ``generation``.
    ``first_parent`` is the key before ``keys[0]`` when the chain is a continuation; ``tokens`` (the
    chain's token ids from its first block on) gives each block its own ids.
    """
    chunks = as_chunks(layout, offsets)
    if prompt_tokens is not None:
        chunks = with_generation(chunks, prompt_tokens, len(keys) * block_size)
    metas = tag_blocks(chunks, len(keys), block_size, retention, tokens=tokens)
    return keyed(metas, keys, first_parent)


def chain_meta(
    keys: Sequence[bytes],
    block_size: int,
    retention: Retention | None = None,
    *,
    layout: Layout | None = None,
    tokens: Sequence[int] | None = None,
    prompt_tokens: int | None = None,
    first_parent: bytes = b"",
) -> dict[bytes, BlockMeta] | None:
    """What an engine hook stores with a chain: :func:`block_meta` of its layout, with each block's token
    ids when ``retention.warm_tokens`` asks for them (then a chain without a layout gets untagged entries
    with parents and ids). None when there is neither: the store is untagged, exactly as it always was.
    ``prompt_tokens`` (where generation starts) only counts with a layout."""
    rules = retention or Retention()
    ids = tokens if rules.warm_tokens else None
    if layout is None and ids is None:
        return None
    if layout is None:
        return block_meta(keys, [], block_size, rules, first_parent=first_parent, tokens=ids)
    return block_meta(
        keys, layout, block_size, rules, prompt_tokens=prompt_tokens, first_parent=first_parent, tokens=ids
    )


__all__ = [
    "GENERATION",
    "MAX_CHUNKS",
    "Chunk",
    "Layout",
    "LayoutError",
    "as_chunks",
    "block_meta",
    "chain_meta",
    "keyed",
    "parse_layout",
    "tag_blocks",
    "token_span",
    "with_generation",
    "with_parents",
]
