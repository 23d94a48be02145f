"""SGLang's own cache objects on CPU, driven the way its scheduler drives them, for the tier's tests.

Builds a real ``MHATokenToKVPool`` (device pool, on CPU), a real ``MHATokenToKVPoolHost`` in the
layout asked for and a whole ``HiCacheController`` (``io_backend="direct"``) whose backup, prefetch,
prefetch-IO and prefetch-sync threads run. :meth:`Node.backup` and :meth:`Node.prefetch` play the
scheduler's part (HiRadixCache's): hand the controller a write or a prefetch and read its acks. Page
keys are SGLang's own chained SHA-256 hashes (``get_storage_hash_str``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from tests.connectors.sglang.cpu_torch import prepare_sglang

prepare_sglang()

import torch.distributed as dist  # noqa: E402
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

LAYOUTS = ("layer_first", "page_first", "page_first_direct")
MODULE = "tierkv.connectors.sglang"
CLASS = "TierKVStorage"
WAIT_S = 60.0
"""Bound on any one wait for the controller's threads (a wait that long is a failure, not a pass)."""


@dataclass(frozen=True)
class Geometry:
    page: int = 4
    layers: int = 3
    heads: int = 2
    dim: int = 8
    dtype: torch.dtype = torch.bfloat16
    tokens: int = 512
    """Device pool size in tokens; the host pool holds twice as many."""


def _host(cls: Any, device: Any, layout: str, geo: Geometry, **extra: Any) -> Any:
    """SGLang host pool ``cls`` over ``device``'s buffers in ``layout``: on CPU, unpinned, twice its size."""
    return cls(
        device.get_device_pool_infos()[0].buffer_info,
        2.0,
        0,
        geo.page,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=device.size,
        start_layer=device.start_layer,
        end_layer=device.end_layer,
        **extra,
    )


def host_pool(layout: str, geo: Geometry = Geometry()) -> tuple[Any, Any]:
    """A device pool on CPU and its host pool in ``layout``."""
    device = MHATokenToKVPool(geo.tokens, geo.page, geo.dtype, geo.heads, geo.dim, geo.layers, "cpu", False)
    staging = device.hicache_write_back_staging
    return device, _host(MHATokenToKVPoolHost, device, layout, geo, write_back_staging=staging)


def mla_host_pool(layout: str, geo: Geometry = Geometry()) -> Any:
    """An MLA host pool (latent KV of rank 32 plus 8 rope dims per token and layer) in ``layout``."""
    device = MLATokenToKVPool(geo.tokens, geo.page, geo.dtype, 32, 8, geo.layers, "cpu", False)
    return _host(MLATokenToKVPoolHost, device, layout, geo, target_layer_num=geo.layers)


def mamba_host_pool(layers: int = 2, slots: int = 9) -> Any:
    """A Mamba state host pool over CPU checkpoint tensors (temporal state and one conv state per slot)."""
    info = MambaStateBufferInfo(
        temporal=torch.zeros(layers, slots, 4, 8, dtype=torch.float32),
        conv=(torch.zeros(layers, slots, 3, 16, dtype=torch.bfloat16),),
    )
    return MambaPoolHost(
        info, 2.0, 0, device_capacity=slots - 1, pin_memory=False, device="cpu", layout="page_first"
    )


def tierkv_extra(vaults: list[str], *, v1: bool, timeout: float = 2.0, **tierkv: Any) -> dict[str, Any]:
    """``--hicache-storage-backend-extra-config`` loading tierkv's backend by module path."""
    return {
        "backend_name": "tierkv",
        "module_path": MODULE,
        "class_name": CLASS,
        "interface_v1": int(v1),
        "hicache_storage_pass_prefix_keys": True,
        "tierkv": {"kv_cold": ",".join(vaults), "timeout": timeout, "lookup_lease_ms": 0, **tierkv},
    }


def storage_config(
    extra: dict[str, Any],
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    mla: bool = False,
    page_first: bool = False,
    metrics: bool = False,
    model: str = "tiny-test-model",
) -> Any:
    """SGLang's ``HiCacheStorageConfig`` for one rank (no pipeline or context parallelism)."""
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=metrics,
        is_page_first_layout=page_first,
        model_name=model,
        extra_config=extra,
    )


def page_hashes(tokens: list[int], page: int) -> list[str]:
    return list(get_storage_hash_str(tokens, None, page_size=page))


def fill_random(host: Any, indices: torch.Tensor, seed: int) -> None:
    """Random bits (every bf16 pattern, NaNs included) into the pages that ``indices`` lists."""
    gen = torch.Generator().manual_seed(seed)
    for start in indices[:: host.page_size].tolist():
        page = host.get_data_page(int(start), flat=False)
        bits = torch.randint(-(2**15), 2**15, page.shape, generator=gen, dtype=torch.int16)
        page.copy_(bits.view(page.dtype))


def page_bits(host: Any, indices: torch.Tensor) -> list[torch.Tensor]:
    """Each page's bytes (a copy), so comparisons are bit for bit."""
    return [
        host.get_data_page(int(s), flat=True).view(torch.int16).clone()
        for s in indices[:: host.page_size].tolist()
    ]


class Node:
    """One SGLang scheduler's cache: pools, allocator and a HiCacheController with a storage backend."""

    def __init__(
        self, layout: str, backend: str, extra: dict[str, Any] | None, geo: Geometry = Geometry()
    ) -> None:
        self.geo = geo
        self.device, self.host = host_pool(layout, geo)
        allocator = PagedTokenToKVPoolAllocator(geo.tokens, geo.page, geo.dtype, "cpu", self.device, False)
        self.cc = HiCacheController(
            allocator,
            self.host,
            geo.page,
            dist.group.WORLD,
            threading.Event(),
            io_backend="direct",
            storage_backend=backend,
            model_name="tiny-test-model",
            storage_backend_extra_config=extra,
        )
        self.backend = self.cc.storage_backend

    def backup(self, tokens: list[int], seed: int) -> tuple[torch.Tensor, int]:
        """Random pages for ``tokens`` written to storage by the backup thread: (host indices, tokens
        the controller reports stored)."""
        indices = self.host.alloc(len(tokens))
        fill_random(self.host, indices, seed)
        self.cc.write_storage(indices, tokens, hash_value=page_hashes(tokens, self.geo.page), prefix_keys=[])
        op = self.cc.ack_backup_queue.get(timeout=WAIT_S)
        return indices, int(op.completed_tokens)

    def prefetch(self, tokens: list[int], rid: str = "r") -> tuple[torch.Tensor, int, int]:
        """A prefetch as the scheduler runs it: (host indices, tokens the storage reported, tokens loaded)."""
        op = self.cc.prefetch(rid, tokens, None, prefix_keys=[])
        hit = self.cc.prefetch_hit_queue.get(timeout=WAIT_S)
        assert hit is op
        reported = int(op.storage_hit_count)
        indices = self.host.alloc(reported) if reported else torch.empty(0, dtype=torch.int64)
        if not reported:
            return indices, 0, 0
        op.host_indices = indices
        self.cc.prefetch_buffer.put(op)
        loaded = 0
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            ack = self.cc.ack_prefetch_queue.get(timeout=WAIT_S)
            if ack.completed_tokens is not None:
                loaded = max(loaded, int(ack.completed_tokens))
            if ack.completed_req:
                return indices, reported, loaded
        raise AssertionError("the prefetch never completed")

    def close(self) -> None:
        self.cc.detach_storage_backend()
