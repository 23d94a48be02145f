"""A tiered prompt cache for ``mlx_lm.server``: evictions go to the vaults, misses ask them.

mlx-lm's server keeps finished prompts in an :class:`mlx_lm.models.cache.LRUPromptCache`. Every entry it
drops for space or count leaves through its trie's ``pop`` (``insert_cache`` over ``max_size`` /
``max_bytes``, ``trim_to`` under ``--prompt-cache-bytes``); entries dropped because a longer one covers
them (``pop_prefixes``) are not shipped — the longer one holds their blocks. Every lookup goes through
``fetch_nearest_cache``: when the vaults hold a longer prefix than memory, that one is restored.

Shipping happens on the server's generation thread, at eviction time, synchronously: the entry's
arrays are copied into blobs before the server frees them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mlx_lm.models.cache import LRUPromptCache, PromptTrie

from tierkv.connectors.mlx.hook import MlxTier

log = logging.getLogger(__name__)

TierFor = Callable[[Any], "MlxTier | None"]
"""The hook for a server model key (``None``: that model is not tiered, e.g. with a draft model)."""


class _ShippingTrie(PromptTrie):  # type: ignore[misc]
    """mlx-lm's prompt trie, reporting each entry it pops to ``on_pop``."""

    def __init__(self, on_pop: Callable[[Any, list[int], Any], None]) -> None:
        super().__init__()
        self._on_pop = on_pop

    def pop(self, model: Any, tokens: list[int]) -> Any:
        entry = super().pop(model, tokens)
        self._on_pop(model, tokens, entry)
        return entry


class TieredPromptCache(LRUPromptCache):  # type: ignore[misc]
    """An ``LRUPromptCache`` whose evictions are stored in the vaults and whose misses are restored.

    ``tier_for`` maps the server's model key to its :class:`~tierkv.connectors.mlx.hook.MlxTier`.
    ``shipped`` / ``restored`` count entries stored and lookups answered from the vaults; ``refused``
    the blobs a vault refused (budget, tenant quota or no room) and none stored.
    """

    def __init__(self, tier_for: TierFor, max_size: int = 10, max_bytes: int = 1 << 63) -> None:
        super().__init__(max_size=max_size, max_bytes=max_bytes)
        self._trie = _ShippingTrie(self._ship)
        self.tier_for = tier_for
        self.shipped = 0
        self.restored = 0
        self.refused = 0

    def _ship(self, model: Any, tokens: list[int], entry: Any) -> None:
        tier = self.tier_for(model)
        if tier is None or len(entry.prompt_cache) != len(tier.layout.kinds):
            return
        try:
            tally = tier.store_cache(tokens, entry.prompt_cache)
        except Exception:  # a failed store must never break the server's eviction
            log.exception("storing an evicted prompt cache entry failed")
            return
        self.shipped += tally.stored > 0
        self.refused += tally.rejected
        log.info(
            "evicted prompt of %d tokens: %d blobs stored, %d refused",
            len(tokens),
            tally.stored,
            tally.rejected,
        )

    def fetch_nearest_cache(self, model: Any, tokens: list[int]) -> tuple[Any, list[int]]:
        cache, rest = super().fetch_nearest_cache(model, tokens)
        tier = self.tier_for(model)
        if tier is None or len(tokens) - len(rest) >= tier.reachable(len(tokens)):
            return cache, rest
        try:
            prepared = tier.restore(tokens)
        except Exception:  # the vaults are an optimisation: fall back to what memory had
            log.exception("restoring a prompt from the vaults failed")
            return cache, rest
        if prepared.restored <= len(tokens) - len(rest):
            return cache, rest
        self.restored += 1
        log.info("restored %d of %d prompt tokens from the vaults", prepared.restored, len(tokens))
        return prepared.cache, tokens[prepared.restored :]


__all__ = ["TierFor", "TieredPromptCache"]
