"""Records the vaults answer with that every layer reads: the client returns them, the pipeline's
:class:`~tierkv.tiering.storage.Hints` declare them, and in-process storages build them. Plain values,
no imports: whoever maps them to or from protobuf does so in one place (the client's reply parsing)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class HotChain:
    """One of a namespace's most-hit chains (``Hottest``): keys root first, the decayed hits of its last
    block, the class of its first, and its token ids (empty when the vault cannot replay it: a block
    stored without ids, or a prefix it does not hold)."""

    keys: tuple[bytes, ...]
    hits: float
    source: str
    tokens: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Successor:
    """A block the vault expects to be fetched next (``Successors``): its key, blob size and score (higher
    is likelier; a vault answers best first)."""

    key: bytes
    size: int
    score: float


__all__ = ["HotChain", "Successor"]
