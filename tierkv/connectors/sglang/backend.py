"""tierkv vaults as SGLang's HiCache L3 storage: a ``HiCacheStorage`` over the shared pipeline.

SGLang loads it by module path (no patch)::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "tierkv",
        "module_path": "tierkv.connectors.sglang", "class_name": "TierKVStorage",
        "interface_v1": 1, "hicache_storage_pass_prefix_keys": true,
        "tierkv": {"kv_cold": "10.0.0.5:50051", "model_id": "llama-3-8b"}}'

``tierkv`` holds :class:`~tierkv.connectors.vault_settings.VaultSettings` (or nothing, with a
tierkv.toml). ``interface_v1`` selects the zero-copy path (``batch_get_v1`` / ``batch_set_v1`` on host
pool indices: blobs are received straight into the host pool where the transport can); without it
SGLang's generic path hands flat page tensors to ``batch_get`` / ``batch_set``. Both store the same blobs
(:mod:`tierkv.connectors.sglang.pages`).

What SGLang's controller threads see: ``batch_exists`` is the leading run the vaults hold (one lookup,
leased so the pages are still there when the prefetch reads them); a page that is missing, evicted or
fails verification is a miss (a corrupt one is deleted from the vaults); a vault that is down or hung
is a miss within the cluster's deadline. No call raises for a vault failure. ``batch_set`` reports
success only for pages a vault acknowledged. With ``hicache_storage_pass_prefix_keys`` each page is
stored with its parent (the page before it), so the vaults' retention sees whole chains.

Hybrid models (Mamba / SWA / indexer pools, SGLang's ``batch_*_v2`` with its per-pool hit policies) are
refused at attach: that path is not built yet. Full-attention and MLA KV pages are stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from tierkv.codec import LayerGroup
from tierkv.connectors.sglang.pages import PagePool, Ranks, byte_rows, page_keys, page_namespace
from tierkv.connectors.sglang.stats import PageStats
from tierkv.connectors.vault_settings import VaultSettings
from tierkv.errors import ConfigError, TierKVError
from tierkv.keys import Namespace
from tierkv.retention import UNTAGGED, keyed
from tierkv.tiering import ColdTier, Restored, Storage, StreamSpec
from tierkv.tiering.tensors import TorchArrays

logger = logging.getLogger(__name__)

SOURCE = "hicache-storage-backend-extra-config"
SETTINGS_KEY = "tierkv"
"""The key of ``extra_config`` that holds tierkv's own settings (the rest is SGLang's)."""


class TierKVStorage(HiCacheStorage):  # type: ignore[misc]  # SGLang's ABC, untyped
    """SGLang's L3 over tierkv vaults. ``storage`` replaces the vaults of the settings (tests)."""

    def __init__(
        self, storage_config: Any, kwargs: Mapping[str, Any] | None = None, *, storage: Storage | None = None
    ) -> None:
        extra = dict(storage_config.extra_config or {})
        self.settings = VaultSettings.from_extra(extra.get(SETTINGS_KEY) or {}, f"{SOURCE}: {SETTINGS_KEY}")
        self.storage_config = storage_config
        self.ranks = Ranks.of(storage_config)
        self.storage = storage if storage is not None else self.settings.cluster()
        self.tier = ColdTier(self.storage, TorchArrays())
        self._metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self.stats = PageStats(sampling=self._metrics)
        self.pool: PagePool | None = None
        self.namespace: Namespace | None = None
        self.spec: StreamSpec | None = None

    # -- host pools ------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """SGLang hands over its host pool after building the backend: the namespace follows from it."""
        super().register_mem_pool_host(mem_pool_host)
        pool = PagePool(mem_pool_host)
        model = self.settings.model_id or (self.storage_config.model_name or "")
        self.namespace = page_namespace(
            pool, self.ranks, model=model, codec=self.settings.codec, tenant=self.settings.namespace
        )
        self.spec = StreamSpec(self.namespace.digest, LayerGroup.ATTENTION, self.settings.codec)
        self.pool = pool
        logger.info(
            "tierkv: %s pages of shape %s (%s), namespace %s",
            pool.layout,
            pool.shape,
            pool.dtype,
            self.namespace.hex[:16],
        )

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        if str(host_pool_name) != "kv":
            raise ConfigError(
                SOURCE,
                "backend_name",
                f"tierkv stores full-attention and MLA KV pages; the {host_pool_name} pool of a hybrid "
                "model (SGLang's batch_*_v2) is not supported",
            )
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    def _ready(self) -> tuple[PagePool, Namespace, StreamSpec]:
        if self.pool is None or self.namespace is None or self.spec is None:
            raise TierKVError("tierkv: no host pool registered yet (SGLang calls register_mem_pool_host)")
        return self.pool, self.namespace, self.spec

    # -- lookup ----------------------------------------------------------------------------------

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading ``keys`` the vaults hold (leased for ``lookup_lease_ms``)."""
        _, ns, spec = self._ready()
        return self.tier.lookup(spec, page_keys(ns, keys), lease_ms=self.settings.lookup_lease_ms)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- load ------------------------------------------------------------------------------------

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        """Generic path: each page into its flat tensor; the tensor, or None where the page is not back."""
        pool, _, _ = self._ready()
        targets = list(target_locations) if target_locations is not None else []
        targets += [pool.host.get_dummy_flat_data_page() for _ in range(len(keys) - len(targets))]
        got = self._load(keys, [t.view(pool.shape) for t in targets])
        return [t if ok else None for t, ok in zip(targets, got, strict=True)]

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Zero-copy path: each page straight into the host pool at ``host_indices``."""
        pool, _, _ = self._ready()
        return self._load(keys, pool.pages(host_indices, len(keys)))

    def _load(self, keys: Sequence[str], pages: Sequence[torch.Tensor]) -> list[bool]:
        """One restore of ``keys`` into ``pages`` (page-shaped views); which pages arrived verified."""
        pool, ns, spec = self._ready()
        expect = spec.expect(pool.shape, pool.page_size, pool.dtype)
        start = time.perf_counter()
        try:
            if spec.codec == "raw":
                result = self.tier.restore(
                    spec,
                    page_keys(ns, keys),
                    expect,
                    place=_placer(pages),
                    rows=lambda i: byte_rows(pages[i]),
                )
            else:
                result = self.tier.restore(
                    spec, page_keys(ns, keys), expect, lambda n: pages[n], leading_only=True
                )
        except TierKVError:
            logger.exception("tierkv: loading %d pages failed; they are misses", len(keys))
            result = Restored(len(keys))
        self._count_load(result, time.perf_counter() - start)
        good = set(result.decoded)
        return [i in good for i in range(len(keys))]

    def _count_load(self, result: Restored, seconds: float) -> None:
        missed = result.asked - len(result.decoded) - result.rejected
        self.stats.loaded(
            len(result.decoded), missed, result.rejected, result.landed, result.decoded_bytes, seconds
        )

    # -- store -----------------------------------------------------------------------------------

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        """Generic path (all or nothing): the flat pages ``values``; True when every one was acknowledged."""
        pool, _, _ = self._ready()
        stored = self._store(keys, [v.view(pool.shape) for v in values], None)
        return all(stored)

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Zero-copy path: the pages at ``host_indices``; per page, whether a vault acknowledged it."""
        pool, _, _ = self._ready()
        return self._store(keys, pool.pages(host_indices, len(keys)), extra_info)

    def _store(self, keys: Sequence[str], pages: Sequence[torch.Tensor], extra_info: Any) -> list[bool]:
        pool, ns, spec = self._ready()
        wrapped = page_keys(ns, keys)
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        parent = page_keys(ns, prefix[-1:])[0] if prefix else b""
        meta = keyed([UNTAGGED] * len(wrapped), wrapped, parent)
        start = time.perf_counter()
        try:
            tally = self.tier.store(
                spec, ((k, p, pool.page_size) for k, p in zip(wrapped, pages, strict=True)), meta
            )
        except TierKVError:
            logger.exception("tierkv: storing %d pages failed", len(keys))
            return [False] * len(keys)
        acked = set(tally.acked)
        self.stats.stored(len(acked), len(keys) - len(acked), tally.stored_bytes, time.perf_counter() - start)
        return [k in acked for k in wrapped]

    # -- the rest of SGLang's interface ----------------------------------------------------------

    def clear(self) -> bool:
        """Not offered: vaults are shared and evict by their own policy; SGLang's flush clears its tiers."""
        logger.warning("tierkv: clear() is not supported; the vaults keep their pages until they evict them")
        return False

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` of the calls since the last ``get_stats`` (None without metrics)."""
        if not self._metrics:
            return None
        from sglang.srt.observability.metrics_collector import StorageMetrics

        prefetch_pgs, backup_pgs, prefetch_bw, backup_bw = self.stats.drain()
        return StorageMetrics(
            prefetch_pgs=prefetch_pgs,
            backup_pgs=backup_pgs,
            prefetch_bandwidth=prefetch_bw,
            backup_bandwidth=backup_bw,
        )

    def close(self) -> None:
        self.tier.close()
        self.storage.close()


def _placer(pages: Sequence[torch.Tensor]) -> Callable[[int, torch.Tensor], None]:
    """``place`` for a restore: copy a verified page's values into its view (the one copy)."""

    def place(i: int, values: torch.Tensor) -> None:
        pages[i].copy_(values)

    return place


__all__ = ["SETTINGS_KEY", "TierKVStorage"]
