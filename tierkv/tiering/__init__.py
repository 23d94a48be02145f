"""Engine-agnostic tiering logic: the hot tier, restore planning, character-level prefix reuse.

Also what every engine hook shares: bounded background work, byte-bounded put batches and the checks
of its settings.
"""

from tierkv.tiering.background import BoundedWorker
from tierkv.tiering.batches import byte_batches
from tierkv.tiering.checks import at_least, one_of
from tierkv.tiering.hot import HotEntry, HotTier, as_tokens, common_prefix_len
from tierkv.tiering.plan import (
    RestorePlan,
    full_blocks,
    plan_restore,
    restore_limit,
    snapshot_boundaries,
    snapshot_candidates,
)
from tierkv.tiering.textmatch import (
    DEFAULT_MIN_FRACTION,
    Encoder,
    MatchKind,
    TextIndex,
    TextMatch,
    TextPlan,
    TokenizedText,
    common_prefix_chars,
    match_text,
    plan_from_index,
    plan_text,
)

__all__ = [
    "DEFAULT_MIN_FRACTION",
    "BoundedWorker",
    "Encoder",
    "HotEntry",
    "HotTier",
    "MatchKind",
    "RestorePlan",
    "TextIndex",
    "TextMatch",
    "TextPlan",
    "TokenizedText",
    "as_tokens",
    "at_least",
    "byte_batches",
    "common_prefix_chars",
    "common_prefix_len",
    "full_blocks",
    "match_text",
    "one_of",
    "plan_from_index",
    "plan_restore",
    "plan_text",
    "restore_limit",
    "snapshot_boundaries",
    "snapshot_candidates",
]
