"""SGLang's host KV pool as tierkv sees it: one page, one blob, in one stream per rank and layout.

A page of a host pool (``MHATokenToKVPoolHost``, ``MLATokenToKVPoolHost``) is what
``get_data_page(index, flat=False)`` returns: a strided view into the pool, ``[2, layers, page, heads,
dim]`` for ``layer_first``, ``[2, page, layers, heads, dim]`` for ``page_first``, ``[2, 1, layers, page,
heads, dim]`` for ``page_first_direct``. A blob holds that view's values in C order, which is also the
order of ``get_data_page(index, flat=True)`` and of the flat pages SGLang hands the generic
``batch_get`` / ``batch_set``: both paths (generic and zero-copy ``_v1``) read and write the very same
blobs. The layout and the page's shape are in the namespace, so a server restarted with another layout
misses instead of reading pages in the wrong order.

SGLang's page keys (chained SHA-256 hex of the tokens, seeded by extra key and cache salt) say nothing
of model, dtype or rank; the namespace does (:func:`page_namespace`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tierkv.codec.torch_codec import dtype_name
from tierkv.errors import ConfigError
from tierkv.keys import Namespace, wrap_engine_hashes

LAYOUT_PREFIX = "sglang-hicache-v1"
"""Version of this adapter's page blobs; bump it when a blob's values change meaning."""


@dataclass(frozen=True)
class Ranks:
    """Where this process's pages sit in the parallel world (from SGLang's ``HiCacheStorageConfig``).

    MLA (and compressed-MLA) KV is the same on every TP rank: such pools share rank 0's namespace."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    replicated: bool = False

    @classmethod
    def of(cls, storage_config: Any) -> Ranks:
        return cls(
            tp_rank=storage_config.tp_rank,
            tp_size=storage_config.tp_size,
            pp_rank=storage_config.pp_rank,
            pp_size=storage_config.pp_size,
            cp_rank=storage_config.attn_cp_rank,
            cp_size=storage_config.attn_cp_size,
            replicated=bool(storage_config.is_mla_model),
        )


class PagePool:
    """One registered host pool (``name``: SGLang's pool name): page views by host index, and the shape
    every page blob carries. ``views`` is False for a pool whose pages are copies (Mamba states)."""

    def __init__(self, host: Any, name: str = "kv") -> None:
        self.host = host
        self.name = name
        self.page_size = int(host.page_size)
        try:
            first = host.get_data_page(0, flat=False)
        except (ValueError, AttributeError, NotImplementedError) as exc:
            raise ConfigError(
                "hicache-storage-backend",
                "hicache_mem_layout",
                "tierkv stores pages of layer_first, page_first, page_first_direct and page_head pools; "
                f"{type(host).__name__} with layout {getattr(host, 'layout', '?')!r} has no page view "
                f"({exc})",
            ) from exc
        self.shape: tuple[int, ...] = tuple(first.shape)
        self.views = first._base is not None
        self.dtype = "uint8" if first.dtype == torch.uint8 else dtype_name(first.dtype)
        """``uint8``: opaque bytes (a state page of mixed dtypes), stored raw through numpy."""
        self.layout = str(host.layout)

    def page(self, host_index: int) -> torch.Tensor:
        """The page that starts at ``host_index`` (a token index), as a view into the pool."""
        return self.host.get_data_page(host_index, flat=False)  # type: ignore[no-any-return]

    def pages(self, host_indices: torch.Tensor, count: int) -> list[torch.Tensor]:
        """Views of the ``count`` pages whose tokens ``host_indices`` lists, page by page."""
        starts = host_indices[:: self.page_size][:count].tolist()
        return [self.page(int(i)) for i in starts]

    def tag(self) -> str:
        """The namespace's layout field: adapter version, pool, host layout and page shape."""
        return f"{LAYOUT_PREFIX}/{self.name}/{self.layout}/{'x'.join(map(str, self.shape))}"


def page_namespace(pool: PagePool, ranks: Ranks, *, model: str, codec: str, tenant: str) -> Namespace:
    """The namespace of one rank's pages: model, dtype, codec, layout and page shape, TP / PP / CP rank."""
    if not model:
        raise ConfigError(
            "hicache-storage-backend-extra-config",
            "tierkv.model_id",
            "SGLang passed no model name: set model_id so pages of different models never mix",
        )
    tp_rank, tp_world = (0, 1) if ranks.replicated else (ranks.tp_rank, ranks.tp_size)
    return Namespace(
        model=model,
        dtype=pool.dtype,
        codec=codec,
        layout=pool.tag(),
        tp_rank=tp_rank,
        tp_world=tp_world,
        pp_rank=ranks.pp_rank,
        pp_world=ranks.pp_size,
        tenant=tenant,
        extra={"cp": f"{ranks.cp_rank}/{ranks.cp_size}"},
    )


def page_keys(namespace: Namespace, keys: Sequence[str]) -> list[bytes]:
    """SGLang's page keys (strings) as tierkv block keys inside ``namespace``."""
    return wrap_engine_hashes(namespace, [key.encode() for key in keys])


def byte_rows(view: torch.Tensor) -> list[memoryview] | None:
    """The writable bytes of a CPU page view as its contiguous runs, in C order; None off the CPU.

    A ``layer_first`` page is ``2 × layers`` runs (K and V of each layer lie apart in the pool), a
    ``page_first`` page two, a flat page one: a transport that receives a blob into these runs writes
    straight into SGLang's host pool.
    """
    if view.device.type != "cpu":
        return None
    lead = 0
    while not view[(0,) * lead].is_contiguous():
        lead += 1
    array = view.view(torch.uint8).numpy()  # the last axis counts bytes; shares the pool's memory
    return [memoryview(array[idx]).cast("B") for idx in itertools.product(*map(range, view.shape[:lead]))]


__all__ = ["LAYOUT_PREFIX", "PagePool", "Ranks", "byte_rows", "page_keys", "page_namespace"]
