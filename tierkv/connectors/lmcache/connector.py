"""tierkv vaults as an LMCache remote tier: a ``RemoteConnector`` over the shared pipeline.

LMCache loads it by module path (no patch), in its engine config::

    remote_storage_plugins: ["tierkv"]
    extra_config:
      remote_storage_plugin.tierkv.module_path: tierkv.connectors.lmcache
      remote_storage_plugin.tierkv.class_name: TierKVConnector
      remote_storage_plugin.tierkv.kv_cold: "10.0.0.5:50051"   # any VaultSettings key, or a tierkv.toml

One LMCache chunk (a ``MemoryObj``: ``[2, layers, tokens, hidden]`` for ``KV_2LTD``) is one raw blob;
the last chunk of a prompt may hold fewer tokens, so a blob is taken in whatever shape it verified in
and LMCache allocates its buffer from that (``shape``/``tokens`` of the expectation left open). The
namespace carries model, dtype, memory format, full-chunk shape, worker rank and world, and the tenant;
LMCache's key string (model, world, worker, chunk hash, dtype) is the block key inside it.

LMCache's methods are coroutines on its event loop; every vault call runs in the loop's executor, so
the loop never waits on a socket. A vault failure is a miss (``None``, 0, False); a put no vault
acknowledged raises :class:`~tierkv.errors.TierKVError`, which LMCache counts as a failed put. Batched
``contains`` is the leading run the vaults hold (one lookup, leased).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from tierkv.codec import LayerGroup
from tierkv.codec.torch_codec import dtype_name
from tierkv.connectors.vault_settings import VaultSettings
from tierkv.errors import ConfigError, TierKVError
from tierkv.keys import Namespace, wrap_engine_hashes
from tierkv.tiering import ColdTier, StreamSpec
from tierkv.tiering.tensors import TorchArrays

logger = logging.getLogger(__name__)

LAYOUT_PREFIX = "lmcache-chunk-v1"
"""Version of this connector's chunk blobs; bump it when a blob's values change meaning."""
PLUGIN_KEYS = frozenset({"module_path", "class_name"})
"""LMCache's own keys under ``remote_storage_plugin.<name>.`` (the rest are tierkv's)."""
TOKEN_DIM = 2
"""The token axis of a ``KV_2LTD`` / MLA chunk: ``[2, layers, tokens, hidden]``."""

T = TypeVar("T")


def plugin_settings(extra: Mapping[str, Any] | None, plugin: str) -> dict[str, Any]:
    """tierkv's keys of LMCache's ``extra_config``: those under ``remote_storage_plugin.<plugin>.``."""
    prefix = f"remote_storage_plugin.{plugin}."
    picked = {k[len(prefix) :]: v for k, v in (extra or {}).items() if k.startswith(prefix)}
    return {k: v for k, v in picked.items() if k not in PLUGIN_KEYS}


class TierKVConnector(RemoteConnector):  # type: ignore[misc]  # LMCache's ABC, untyped
    """LMCache's remote connector over tierkv vaults (built by LMCache's ``DynamicConnectorAdapter``)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        local_cpu_backend: Any,
        config: Any,
        plugin_name: str = "tierkv",
    ) -> None:
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        source = f"extra_config: remote_storage_plugin.{plugin_name}"
        settings = VaultSettings.from_extra(
            plugin_settings(getattr(config, "extra_config", None), plugin_name), source
        )
        if settings.codec != "raw":
            raise ConfigError(source, "codec", "LMCache chunks are stored raw (LMCache has its own serdes)")
        metadata = local_cpu_backend.metadata
        if len(self.meta_shapes) != 1:
            raise ConfigError(
                source, "remote_storage_plugins", "chunks of several KV groups are not supported"
            )
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.settings = settings
        self.namespace = Namespace(
            model=settings.model_id or metadata.model_name,
            dtype=dtype_name(self.meta_dtypes[0]),
            codec="raw",
            layout=f"{LAYOUT_PREFIX}/{self.meta_fmt.name}/{'x'.join(map(str, self.meta_shapes[0]))}",
            tp_rank=metadata.worker_id,
            tp_world=metadata.world_size,
            tenant=settings.namespace,
        )
        self.spec = StreamSpec(self.namespace.digest, LayerGroup.ATTENTION, "raw")
        self.expect = self.spec.expect(None, None, self.namespace.dtype)
        self.storage = settings.cluster()
        self.tier = ColdTier(self.storage, TorchArrays())

    def keys(self, keys: Sequence[Any]) -> list[bytes]:
        """LMCache's keys as tierkv block keys inside this connector's namespace."""
        return wrap_engine_hashes(self.namespace, [k.to_string().encode() for k in keys])

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the loop's executor: a vault call never blocks LMCache's event loop."""
        return await self.loop.run_in_executor(None, functools.partial(fn, *args))

    # -- lookup ----------------------------------------------------------------------------------

    def batched_contains(self, keys: list[Any]) -> int:
        """How many leading ``keys`` the vaults hold (leased for ``lookup_lease_ms``)."""
        return self.tier.lookup(self.spec, self.keys(keys), lease_ms=self.settings.lookup_lease_ms)

    def support_batched_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[Any], pin: bool = False) -> int:
        return await self._run(self.batched_contains, keys)

    def exists_sync(self, key: Any) -> bool:
        return self.batched_contains([key]) == 1

    async def exists(self, key: Any) -> bool:
        return await self._run(self.exists_sync, key)

    # -- load ------------------------------------------------------------------------------------

    def get_sync(self, keys: Sequence[Any]) -> list[Any]:
        """One restore of ``keys``: a ``MemoryObj`` per verified chunk (in its own shape), else None."""
        got: list[Any] = [None] * len(keys)
        lock = threading.Lock()

        def place(i: int, values: torch.Tensor) -> None:
            obj = self.local_cpu_backend.allocate([values.shape], [values.dtype], self.meta_fmt)
            if obj is None:
                logger.warning("tierkv: LMCache's CPU buffer is full; chunk %d is a miss", i)
                return
            obj.tensor.copy_(values)
            with lock:
                got[i] = obj

        # only a blob that verified is placed: what was placed is what the restore reports decoded
        self.tier.restore(self.spec, self.keys(keys), self.expect, place=place)
        return got

    async def get(self, key: Any) -> Any:
        return (await self._run(self.get_sync, [key]))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[Any]) -> list[Any]:
        return await self._run(self.get_sync, keys)

    # -- store -----------------------------------------------------------------------------------

    def put_sync(self, keys: Sequence[Any], memory_objs: Sequence[Any]) -> None:
        """Store the chunks; raises :class:`TierKVError` unless a vault acknowledged every one."""
        blocks = [
            (k, obj.tensor, int(obj.tensor.shape[TOKEN_DIM]))
            for k, obj in zip(self.keys(keys), memory_objs, strict=True)
        ]
        tally = self.tier.store(self.spec, blocks)
        if tally.stored < len(blocks):
            raise TierKVError(f"tierkv: {tally.failed} of {len(blocks)} chunks were not acknowledged")

    async def put(self, key: Any, memory_obj: Any) -> None:
        await self._run(self.put_sync, [key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list[Any], memory_objs: list[Any]) -> None:
        await self._run(self.put_sync, keys, memory_objs)

    # -- the rest --------------------------------------------------------------------------------

    def remove_sync(self, key: Any) -> bool:
        return self.storage.delete(self.spec.namespace, self.keys([key]), role=self.spec.role) == 1

    async def list(self) -> list[str]:
        """Not offered: the vaults list no keys (LMCache calls it only for its debugging tools)."""
        return []

    async def close(self) -> None:
        self.tier.close()
        self.storage.close()


__all__ = ["LAYOUT_PREFIX", "TierKVConnector", "plugin_settings"]
