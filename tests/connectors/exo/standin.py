"""A minimal stand-in for EXO's ``exo.worker.engines.mlx.cache`` (EXO needs Python 3.13 and a Rust module,
so it cannot be installed here). Written for these tests, not copied: it has the same signatures, the
same parallel lists and the same contract as EXO's ``KVPrefixCache`` at version 0.3.68 —
``add_kv_cache`` evicts first (LRU, inline ``pop`` from every list) then stores a deep copy;
``get_kv_cache`` returns ``(cache, remaining, matched_index, is_exact)`` for the longest cached prefix,
trimmed so at least one token is left to compute. Two simplifications: eviction is driven by an entry
count (``CAPACITY``) instead of EXO's memory threshold, and snapshots are plain deep copies. As in EXO,
an entry with non-trimmable layers (sliding window, SSM) is usable only back to its nearest snapshot at
or before the match, whose states replace those layers. Nothing here imports mlx at import time, so the
install tests can load it as a fake EXO package in an environment without mlx.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

CAPACITY = 2
"""Entries held before ``_evict_if_needed`` evicts (EXO: memory use above ``EXO_MEMORY_THRESHOLD``)."""

KV_CACHE_BITS: int | None = None
CACHE_GROUP_SIZE = 32
"""EXO's ``constants``: with ``KV_CACHE_BITS`` set, ``make_kv_cache`` builds quantized layers."""


def make_kv_cache(model: Any) -> list[Any]:
    """EXO's cache factory: the model's own caches, else per layer a ``KVCache`` or, with
    ``KV_CACHE_BITS``, a ``QuantizedKVCache``."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

    if hasattr(model, "make_cache"):
        return make_prompt_cache(model)
    if KV_CACHE_BITS is None:
        return [KVCache() for _ in model.layers]
    return [QuantizedKVCache(group_size=CACHE_GROUP_SIZE, bits=KV_CACHE_BITS) for _ in model.layers]


class CacheSnapshot:
    def __init__(self, states: list[Any], token_count: int) -> None:
        self.states = states
        self.token_count = token_count


def has_non_kv_caches(cache: Any) -> bool:
    return any(type(c).__name__ in ("ArraysCache", "RotatingKVCache") for c in cache)


def snapshot_ssm_states(cache: Any) -> CacheSnapshot:
    states = [deepcopy(c) if type(c).__name__ in ("ArraysCache", "RotatingKVCache") else None for c in cache]
    return CacheSnapshot(states, max((getattr(c, "offset", 0) for c in cache), default=0))


def _prefix(a: Any, b: Any) -> int:
    n = 0
    for x, y in zip(a.tolist(), b.tolist(), strict=False):
        if x != y:
            break
        n += 1
    return n


class KVPrefixCache:
    def __init__(self, group: Any) -> None:
        self.prompts: list[Any] = []
        self.caches: list[Any] = []
        self._snapshots: list[Any] = []
        self._media_regions: list[Any] = []
        self._last_used: list[int] = []
        self.prefill_tps: list[float] = []
        self._access_counter = 0
        self._group = group

    def add_kv_cache(
        self,
        prompt_tokens: Any,
        cache: Any,
        ssm_snapshots: Any = None,
        media_regions: Any = None,
        prefill_tps: float = 0.0,
    ) -> None:
        self._evict_if_needed()
        self.prompts.append(prompt_tokens)
        self.caches.append(deepcopy(cache))
        self._snapshots.append(ssm_snapshots)
        self._media_regions.append(media_regions or [])
        self.prefill_tps.append(prefill_tps)
        self._access_counter += 1
        self._last_used.append(self._access_counter)

    def get_kv_cache(self, model: Any, prompt_tokens: Any, media_regions: Any = None) -> Any:
        best, length = None, 0
        for i, cached in enumerate(self.prompts):
            n = _prefix(prompt_tokens, cached)
            if n > length:
                best, length = i, n
        if best is None:
            return make_kv_cache(model), prompt_tokens, None, False
        exact = length >= len(prompt_tokens) - 1
        held = max(getattr(c, "offset", 0) for c in self.caches[best])
        target = min(held, len(prompt_tokens) - 1 if exact else length)
        snapshot = None
        if has_non_kv_caches(self.caches[best]):
            usable = [s for s in self._snapshots[best] or () if s.token_count <= target]
            if not usable:
                return make_kv_cache(model), prompt_tokens, None, False
            snapshot = max(usable, key=lambda s: s.token_count)
            target = snapshot.token_count
        cache = deepcopy(self.caches[best])
        for i, c in enumerate(cache):
            if snapshot is not None and snapshot.states[i] is not None:
                cache[i] = deepcopy(snapshot.states[i])
            else:
                c.trim(held - target)
        self._access_counter += 1
        self._last_used[best] = self._access_counter
        return cache, prompt_tokens[target:], best, exact

    def _evict_if_needed(self) -> None:
        while len(self.caches) >= CAPACITY:
            lru = self._last_used.index(min(self._last_used))
            for entries in (
                self.prompts,
                self.caches,
                self._snapshots,
                self._media_regions,
                self._last_used,
                self.prefill_tps,
            ):
                entries.pop(lru)
