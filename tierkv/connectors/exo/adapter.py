"""A tiered subclass of EXO's ``KVPrefixCache``: its evictions go to the vaults, cold hits come back.

EXO's cache has no extension point, so the subclass wraps the two places that matter:

- ``_evict_if_needed``: the lists are compared before and after EXO's own LRU eviction; each entry
  that disappeared is shipped (its KV blocks, plus those of its snapshots that sit on a block
  boundary — EXO takes them at arbitrary token counts) through :class:`MlxTier`;
- ``get_kv_cache``: when EXO's in-memory match is shorter than what the vaults could give, the stored
  prefix is restored, re-inserted through EXO's own ``add_kv_cache`` (with a snapshot of its recurrent
  / sliding layers) and EXO's ``get_kv_cache`` is asked again, so ``matched_index``, ``prefill_tps``
  and EXO's trimming stay EXO's.

Multi-machine EXO (``group`` not None): each rank stores under its own namespace (the tenant names
rank and world size) and a cold hit is used only when every rank restored the same number of tokens
(an ``all_gather`` across the group). Anything that fails is a miss: EXO recomputes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tierkv.errors import TierKVError

if TYPE_CHECKING:
    from tierkv.connectors.mlx.hook import MlxTier, Prepared
    from tierkv.tiering.storage import Storage

log = logging.getLogger(__name__)

StorageFactory = Callable[[], "Storage"]


def default_storage() -> Storage:
    """The vaults of the tierkv config (``$TIERKV_CONFIG``, ./tierkv.toml, ...), connected on first use."""
    from tierkv.config import load_config
    from tierkv.tiering.storage import LazyStorage, open_cluster

    config = load_config()
    return LazyStorage(lambda: open_cluster(config))


def rank_tenant(group: Any) -> str:
    """The namespace tenant of one rank: ranks hold different shards, so they never share blocks."""
    if group is None:
        return ""
    return f"exo-rank{int(group.rank())}-of-{int(group.size())}"


def agree(group: Any, tokens: int) -> int:
    """``tokens`` when every rank of ``group`` restored exactly as many, else 0 (a collective step)."""
    if group is None:
        return tokens
    import mlx.core as mx

    counts = mx.distributed.all_gather(mx.array([tokens], dtype=mx.int32), group=group)
    low, high = int(mx.min(counts).item()), int(mx.max(counts).item())
    return tokens if low == high == tokens else 0


class _Tiering:
    """The per-cache state: the lazily built :class:`MlxTier` (it needs the model EXO passes to
    ``get_kv_cache``) and the EXO module whose ``snapshot_ssm_states`` / ``has_non_kv_caches`` it uses."""

    def __init__(self, module: ModuleType, storage: StorageFactory, group: Any, options: dict[str, Any]):
        self.module = module
        self.storage_factory = storage
        self.group = group
        self.options = options
        self.tier: MlxTier | None = None
        self.model: Any = None
        self.disabled = False

    def tier_for(self, model: Any) -> MlxTier | None:
        if self.disabled or (self.tier is not None and model is self.model):
            return self.tier
        # EXO's own cache factory: with KV_CACHE_BITS set it builds QuantizedKVCache layers.
        make_cache = getattr(self.module, "make_kv_cache", None)
        if make_cache is None and getattr(self.module, "KV_CACHE_BITS", None) is not None:
            log.warning("tierkv EXO adapter off: EXO quantizes its KV cache but has no make_kv_cache")
            self.disabled = True
            return None
        from tierkv.connectors.mlx.hook import MlxTier

        options = {"make_cache": make_cache, **self.options}
        try:
            self.tier = MlxTier(model, self.storage_factory(), tenant=rank_tenant(self.group), **options)
        except (TierKVError, ValueError) as exc:
            log.warning("tierkv EXO adapter off for this model: %s", exc)
            self.disabled, self.tier = True, None
        self.model = model
        return self.tier

    def ship(self, prompt: Any, cache: Any, snapshots: Any) -> None:
        """Store one evicted entry: its KV blocks and the snapshots that sit on a block boundary."""
        if self.tier is None:
            return
        from tierkv.connectors.mlx.hook import Prepared
        from tierkv.connectors.mlx.states import read_state

        tier = self.tier
        tokens = [int(t) for t in prompt.tolist()]
        prepared = Prepared(tokens, list(cache))
        layers = [s.index for s in tier.layout.snapshots]
        for snap in snapshots or ():
            position = int(snap.token_count)
            usable = 0 < position <= len(tokens) and position % tier.block_size == 0
            if layers and usable and all(snap.states[i] is not None for i in layers):
                prepared.snapshots[position] = [read_state(snap.states[i]) for i in layers]
        try:
            tally = tier.store(prepared)
        except (TierKVError, ValueError) as exc:
            log.warning("tierkv could not ship an evicted EXO entry (%d tokens): %s", len(tokens), exc)
            return
        log.debug("shipped an evicted EXO entry: %d tokens, %s", len(tokens), tally)

    def restore(self, model: Any, prompt: Any, matched: int) -> Prepared | None:
        """The vaults' longest prefix of ``prompt`` when it beats ``matched`` on every rank, else None."""
        tier = self.tier_for(model)
        if tier is None or tier.reachable(len(prompt)) <= matched:
            return None
        prepared: Prepared | None = None
        try:
            prepared = tier.restore(prompt)
        except (TierKVError, ValueError) as exc:
            log.warning("tierkv restore failed, EXO recomputes: %s", exc)
        useful = prepared.restored if prepared is not None and prepared.restored > matched else 0
        # Every rank reaches this collective step: the condition above is the same on all of them.
        return prepared if agree(self.group, useful) > 0 else None


def tiered_prefix_cache(
    module: ModuleType, storage: StorageFactory = default_storage, **options: Any
) -> type:
    """A subclass of ``module.KVPrefixCache`` (EXO's) tiered through the vaults ``storage()`` opens.

    ``options`` go to :class:`~tierkv.connectors.mlx.hook.MlxTier` (``block_size``, ``codec``, ...).
    Call :func:`tierkv.connectors.exo.guard.check` on ``module`` first.
    """
    base: type = module.KVPrefixCache

    class TieredKVPrefixCache(base):  # type: ignore[valid-type, misc]
        """EXO's ``KVPrefixCache`` with a cold tier behind it (see :mod:`tierkv.connectors.exo.adapter`)."""

        def __init__(self, group: Any) -> None:
            super().__init__(group)
            self._tierkv = _Tiering(module, storage, group, dict(options))

        def _evict_if_needed(self) -> None:
            before = list(zip(self.prompts, self.caches, self._snapshots, strict=True))
            super()._evict_if_needed()
            kept = {id(c) for c in self.caches}
            for prompt, cache, snapshots in before:
                if id(cache) not in kept:
                    self._tierkv.ship(prompt, cache, snapshots)

        def get_kv_cache(self, model: Any, prompt_tokens: Any, media_regions: Any = None) -> Any:
            found = super().get_kv_cache(model, prompt_tokens, media_regions)
            if media_regions:
                return found
            matched = len(prompt_tokens) - len(found[1])
            prepared = self._tierkv.restore(model, prompt_tokens, matched)
            if prepared is None:
                return found
            cache = prepared.cache
            snapshots = [module.snapshot_ssm_states(cache)] if module.has_non_kv_caches(cache) else None
            self.add_kv_cache(prompt_tokens[: prepared.restored], cache, snapshots)
            log.debug("tierkv cold hit: %d tokens (memory had %d)", prepared.restored, matched)
            return super().get_kv_cache(model, prompt_tokens, media_regions)

    TieredKVPrefixCache.__qualname__ = TieredKVPrefixCache.__name__
    TieredKVPrefixCache.__module__ = module.__name__
    return TieredKVPrefixCache


__all__ = ["agree", "default_storage", "rank_tenant", "tiered_prefix_cache"]
