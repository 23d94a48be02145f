"""What a block is to the application: its source class, importance, durability and place in the prefix tree.

Sans-IO vocabulary shared by every layer that carries retention metadata: the engine hooks tag what they
store (:func:`tag_blocks` maps a prompt layout of ordered chunks to per-block :class:`BlockMeta`), the
client sends the metadata with each blob, and the vault's ``context`` policy evicts by it. A store without
a layout carries no metadata (:data:`UNTAGGED`) and is treated exactly as before.
"""

from tierkv.retention.classes import (
    DEFAULT_CLASSES,
    DEFAULT_TTL_S,
    UNTAGGED,
    BlockMeta,
    Durability,
    Retention,
    RetentionClass,
    pack_tokens,
    unpack_tokens,
)
from tierkv.retention.layout import (
    GENERATION,
    Chunk,
    Layout,
    LayoutError,
    as_chunks,
    block_meta,
    chain_meta,
    keyed,
    parse_layout,
    tag_blocks,
    with_generation,
    with_parents,
)

__all__ = [
    "DEFAULT_CLASSES",
    "DEFAULT_TTL_S",
    "GENERATION",
    "UNTAGGED",
    "BlockMeta",
    "Chunk",
    "Durability",
    "Layout",
    "LayoutError",
    "Retention",
    "RetentionClass",
    "as_chunks",
    "block_meta",
    "chain_meta",
    "keyed",
    "pack_tokens",
    "parse_layout",
    "tag_blocks",
    "unpack_tokens",
    "with_generation",
    "with_parents",
]
