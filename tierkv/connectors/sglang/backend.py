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

Hybrid models (SGLang's ``batch_*_v2``): Mamba / linear-attention states are stored in the ``ssm_cold``
vaults and sliding-window pages in ``kv_cold``, each pool in a namespace of its own, with SGLang's hit
policies ``ALL_PAGES`` and ``TRAILING_PAGES`` (:mod:`tierkv.connectors.sglang.hybrid`); other state
pools (DSA indexers, compressed DeepSeek pools, draft pools) are refused at attach.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from tierkv.codec import LayerGroup
from tierkv.connectors.sglang.hybrid import POOL_GROUPS, exists_v2, io_v2
from tierkv.connectors.sglang.pages import PagePool, Ranks, page_namespace
from tierkv.connectors.sglang.stats import PageStats
from tierkv.connectors.sglang.streams import PageStream
from tierkv.connectors.vault_settings import VaultSettings
from tierkv.errors import ConfigError, TierKVError
from tierkv.keys import Namespace
from tierkv.tiering import Storage

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
        self._metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self.stats = PageStats(sampling=self._metrics)
        self.kv: PageStream | None = None
        self.sidecars: dict[str, PageStream] = {}

    @property
    def pool(self) -> PagePool | None:
        return self.kv.pool if self.kv is not None else None

    @property
    def namespace(self) -> Namespace | None:
        return self.kv.namespace if self.kv is not None else None

    # -- host pools ------------------------------------------------------------------------------

    def _stream(self, host: Any, name: str, group: LayerGroup) -> PageStream:
        """The stream of one host pool; state pools are sharded by TP rank even for MLA models."""
        pool = PagePool(host, name)
        ranks = (
            self.ranks if group is LayerGroup.ATTENTION else dataclasses.replace(self.ranks, replicated=False)
        )
        codec = self.settings.codec if group in (LayerGroup.ATTENTION, LayerGroup.SLIDING) else "raw"
        namespace = page_namespace(
            pool,
            ranks,
            model=self.settings.model_id or (self.storage_config.model_name or ""),
            codec=codec,
            tenant=self.settings.namespace,
        )
        logger.info(
            "tierkv: %s pool, %s pages of shape %s (%s), namespace %s",
            name,
            pool.layout,
            pool.shape,
            pool.dtype,
            namespace.hex[:16],
        )
        return PageStream(self.storage, pool, namespace, group, self.stats, self.settings.lookup_lease_ms)

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """SGLang hands over its host pool after building the backend: the namespace follows from it."""
        super().register_mem_pool_host(mem_pool_host)
        self.kv = self._stream(mem_pool_host, "kv", LayerGroup.ATTENTION)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """A hybrid model's pools, one by one: Mamba states and sliding-window pages get streams."""
        name = str(host_pool_name)
        if name != "kv":
            group = POOL_GROUPS.get(name)
            if group is None:
                raise ConfigError(
                    SOURCE,
                    "backend_name",
                    f"tierkv stores KV, Mamba and sliding-window pages; the {name} pool is not supported",
                )
            self.sidecars[name] = self._stream(host_pool, name, group)
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    def _ready(self) -> PageStream:
        if self.kv is None:
            raise TierKVError("tierkv: no host pool registered yet (SGLang calls register_mem_pool_host)")
        return self.kv

    # -- lookup ----------------------------------------------------------------------------------

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading ``keys`` the vaults hold (leased for ``lookup_lease_ms``)."""
        return self._ready().lookup(keys)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists_v2(self, keys: list[str], pool_transfers: Any = None, extra_info: Any = None) -> Any:
        """The longest prefix every pool can restore, under each transfer's hit policy."""
        return exists_v2(self._ready(), self.sidecars, keys, list(pool_transfers or ()))

    # -- load ------------------------------------------------------------------------------------

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        """Generic path: each page into its flat tensor; the tensor, or None where the page is not back."""
        kv = self._ready()
        targets = list(target_locations) if target_locations is not None else []
        targets += [kv.pool.host.get_dummy_flat_data_page() for _ in range(len(keys) - len(targets))]
        got = kv.load(keys, [t.view(kv.pool.shape) for t in targets])
        return [t if ok else None for t, ok in zip(targets, got, strict=True)]

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Zero-copy path: each page straight into the host pool at ``host_indices``."""
        kv = self._ready()
        return kv.load(keys, kv.pool.pages(host_indices, len(keys)))

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> dict[Any, list[bool]]:
        return io_v2(self._streams(), list(transfers), store=False, prefix=None)

    # -- store -----------------------------------------------------------------------------------

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        """Generic path (all or nothing): the flat pages ``values``; True when every one was acknowledged."""
        kv = self._ready()
        return all(kv.store(keys, [v.view(kv.pool.shape) for v in values], None))

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Zero-copy path: the pages at ``host_indices``; per page, whether a vault acknowledged it."""
        kv = self._ready()
        return kv.store(keys, kv.pool.pages(host_indices, len(keys)), _parent(extra_info))

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> dict[Any, list[bool]]:
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        return io_v2(self._streams(), list(transfers), store=True, prefix=prefix)

    def _streams(self) -> dict[str, PageStream]:
        return {"kv": self._ready(), **self.sidecars}

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
        streams = [*([self.kv] if self.kv is not None else []), *self.sidecars.values()]
        for stream in streams:
            stream.tier.close()
        self.storage.close()


def _parent(extra_info: Any) -> str | None:
    """The key of the page before a batch (SGLang's ``prefix_keys``), if SGLang passes it."""
    prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
    return prefix[-1] if prefix else None


__all__ = ["SETTINGS_KEY", "TierKVStorage"]
