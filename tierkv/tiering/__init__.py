"""Engine-agnostic tiering logic: the hot tier, restore planning, character-level prefix reuse."""

from tierkv.tiering.background import BoundedWorker
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
    "common_prefix_chars",
    "common_prefix_len",
    "full_blocks",
    "match_text",
    "plan_from_index",
    "plan_restore",
    "plan_text",
    "restore_limit",
    "snapshot_boundaries",
    "snapshot_candidates",
]
