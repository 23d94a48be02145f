"""Source classes, durability and the metadata one stored block carries.

Defaults follow what agent applications keep: an agent's axioms, identity and rules are protected (never
evicted while they fit under the tenant's protected cap), tool results and memories are worth keeping,
one-off generation is the first to go. ``tierkv.toml``'s ``[retention.classes.NAME]`` overrides or adds
classes; a class name the configuration does not know keeps the importance and durability the chunk
itself gave (or the neutral defaults).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import struct
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

from tierkv.limits import MAX_BLOCK_TOKEN_BYTES


class Durability(str, enum.Enum):
    """How long a block is worth keeping at all; past its time to live it reads as a miss."""

    EPHEMERAL = "ephemeral"
    SESSION = "session"
    PERSISTENT = "persistent"
    PERMANENT = "permanent"

    def __str__(self) -> str:
        return self.value

    @property
    def rank(self) -> int:
        """Longer-lived is more protective: ephemeral 0 … permanent 3."""
        return _RANK[self]


_RANK = {d: i for i, d in enumerate(Durability)}

DEFAULT_TTL_S: Final[Mapping[Durability, float | None]] = MappingProxyType(
    {
        Durability.EPHEMERAL: 15 * 60.0,
        Durability.SESSION: 3600.0,
        Durability.PERSISTENT: 7 * 86400.0,
        Durability.PERMANENT: None,
    }
)
"""Time to live per durability (seconds; None = no expiry); ``[retention.ttl_s]`` overrides them."""

NEUTRAL_IMPORTANCE: Final = 0.5
MAX_SOURCE_BYTES: Final = 64
"""A source class name is at most this many bytes of UTF-8 (it becomes a metrics label on the vault)."""
MAX_TTL_S: Final = 100 * 365 * 86400.0
"""The longest time to live a block may carry (longer is what ``None``, no expiry, is for)."""


def check_importance(value: float) -> float:
    """``value`` if it is a number in [0, 1]; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"importance must be in [0, 1], got {value!r}")
    return float(value)


def check_source(name: str) -> str:
    """``name`` if it can name a source class (printable, at most MAX_SOURCE_BYTES); ValueError otherwise."""
    if len(name.encode()) > MAX_SOURCE_BYTES or not name.isprintable():
        raise ValueError(f"source class must be printable and at most {MAX_SOURCE_BYTES} bytes, got {name!r}")
    return name


@dataclasses.dataclass(frozen=True)
class RetentionClass:
    """A named source class: how important its blocks are, how long they live, whether they are pinned."""

    name: str
    importance: float = NEUTRAL_IMPORTANCE
    durability: Durability = Durability.SESSION
    protected: bool = False

    def __post_init__(self) -> None:
        check_importance(self.importance)


DEFAULT_CLASSES: Final[Mapping[str, RetentionClass]] = MappingProxyType(
    {
        c.name: c
        for c in (
            RetentionClass("axioms", 1.0, Durability.PERMANENT, protected=True),
            RetentionClass("identity", 0.95, Durability.PERMANENT, protected=True),
            RetentionClass("rules", 0.9, Durability.PERSISTENT, protected=True),
            RetentionClass("memories", 0.75, Durability.PERSISTENT),
            RetentionClass("tools", 0.7, Durability.PERSISTENT),
            RetentionClass("context", 0.5, Durability.SESSION),
            RetentionClass("user_turn", 0.4, Durability.SESSION),
            RetentionClass("generation", 0.1, Durability.EPHEMERAL),
        )
    }
)


@dataclasses.dataclass(frozen=True)
class BlockMeta:
    """Retention metadata of one stored block.

    ``ttl_s`` None means no expiry; ``parent`` is the key of the block before it in its chain (empty for a
    chain's first block), which lets the vault count how many stored chains pass through a block.
    ``source`` empty means untagged: the vault treats the block as it always did. ``tokens`` are the
    block's token ids (sent only where ``[retention] warm_tokens`` asks for them), so a warm start can
    replay the chain through an engine; they never make a block tagged.
    """

    source: str = ""
    importance: float = NEUTRAL_IMPORTANCE
    durability: Durability | None = None
    ttl_s: float | None = None
    protected: bool = False
    parent: bytes = b""
    tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_importance(self.importance)
        if len(self.tokens) * 4 > MAX_BLOCK_TOKEN_BYTES:
            raise ValueError(f"more than {MAX_BLOCK_TOKEN_BYTES // 4} token ids in one block")
        if self.ttl_s is not None and not (math.isfinite(self.ttl_s) and 0 < self.ttl_s <= MAX_TTL_S):
            raise ValueError(f"ttl_s must be a positive number of seconds or None, got {self.ttl_s!r}")
        check_source(self.source)

    @property
    def tagged(self) -> bool:
        return bool(self.source) or self.protected or self.durability is not None

    def protection(self) -> tuple[bool, int, float]:
        """Order of protectiveness: pinned first, then longer durability, then importance."""
        rank = self.durability.rank if self.durability is not None else -1
        return (self.protected, rank, self.importance)


UNTAGGED: Final = BlockMeta()


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as the wire and the vault keep them: little-endian int32; ValueError when one is not."""
    try:
        return struct.pack(f"<{len(tokens)}i", *tokens)
    except struct.error as exc:
        raise ValueError(f"token ids must be 32-bit integers: {exc}") from None


def unpack_tokens(raw: bytes | memoryview, limit: int = MAX_BLOCK_TOKEN_BYTES) -> tuple[int, ...]:
    """The ids :func:`pack_tokens` packed; ValueError when ``raw`` is not whole int32s or longer than
    ``limit`` bytes (one block's by default; a whole chain's may be longer)."""
    if len(raw) % 4 or len(raw) > limit:
        raise ValueError(f"token ids must be whole int32s, at most {limit} bytes")
    return struct.unpack(f"<{len(raw) // 4}i", raw)


@dataclasses.dataclass(frozen=True)
class Retention:
    """The class table and time-to-live rules a deployment uses (from ``[retention]`` of tierkv.toml).

    ``warm_tokens``: the hooks send each stored block's token ids with it (even without a layout), so
    ``tierkv snapshot`` / ``tierkv warm`` can replay the hottest chains. Off by default: the ids are the
    prompt's text to anyone who can read the vault, and an untagged store then stays exactly as it was.
    """

    classes: Mapping[str, RetentionClass] = dataclasses.field(default_factory=lambda: dict(DEFAULT_CLASSES))
    ttl_s: Mapping[Durability, float | None] = dataclasses.field(default_factory=lambda: dict(DEFAULT_TTL_S))
    warm_tokens: bool = False

    def meta(
        self,
        source: str,
        *,
        importance: float | None = None,
        durability: Durability | None = None,
        protected: bool | None = None,
    ) -> BlockMeta:
        """Metadata for a block of ``source``: explicit values win, then the class, then neutral."""
        known = self.classes.get(source)
        dur = durability or (known.durability if known else Durability.SESSION)
        return BlockMeta(
            source=source,
            importance=importance if importance is not None else (known.importance if known else 0.5),
            durability=dur,
            ttl_s=self.ttl_s.get(dur, DEFAULT_TTL_S[dur]),
            protected=protected if protected is not None else bool(known and known.protected),
        )


def importance_of_priority(priority: int) -> float:
    """Priority 1–5 (5 highest) as an importance: 0.2, 0.4, 0.6, 0.8, 1.0."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= 5:
        raise ValueError(f"priority must be an integer 1..5, got {priority!r}")
    return priority / 5.0


__all__ = [
    "DEFAULT_CLASSES",
    "DEFAULT_TTL_S",
    "MAX_SOURCE_BYTES",
    "MAX_TTL_S",
    "NEUTRAL_IMPORTANCE",
    "UNTAGGED",
    "BlockMeta",
    "Durability",
    "Retention",
    "RetentionClass",
    "check_importance",
    "check_source",
    "importance_of_priority",
    "pack_tokens",
    "unpack_tokens",
]
