"""Warm start: record the vaults' hottest prefixes (:mod:`.snapshot`) and replay them into a freshly
started engine (:mod:`.replay`), so the connector restores them into the GPU cache before traffic comes.

The vaults know which chains are hit (``Hottest``); the replay needs their token ids, which the engine
hooks send only with ``[retention] warm_tokens = true`` (docs/concepts/warm-start.md).
"""

from tierkv.warm.replay import Replayed, engine_model, replay
from tierkv.warm.snapshot import Prefix, Snapshot, SnapshotError, load_snapshot, take_snapshot

__all__ = [
    "Prefix",
    "Replayed",
    "Snapshot",
    "SnapshotError",
    "engine_model",
    "load_snapshot",
    "replay",
    "take_snapshot",
]
