"""The backend over SGLang's real host pools, on an in-process storage (fast; the vault tests are in
test_sglang_controller.py): page views and their byte runs, namespaces, parents, stats, refusals."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("sglang", reason="SGLang is not installed here (make test-sglang builds .venv-sglang)")

import torch

from tests.connectors.sglang.harness import LAYOUTS, fill_random, host_pool, page_bits, storage_config
from tierkv.connectors.sglang import TierKVStorage
from tierkv.connectors.sglang.pages import PagePool, Ranks, byte_rows, page_keys, page_namespace
from tierkv.errors import ConfigError
from tierkv.tiering import MemoryStorage

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(600)]

from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageExtraInfo,
    PoolName,
)


def pages_config(tp_rank: int = 0, tp_size: int = 1, *, mla: bool = False, **tierkv: Any) -> Any:
    metrics = bool(tierkv.pop("metrics", False))
    extra = {"interface_v1": 1, "tierkv": {"kv_cold": "127.0.0.1:1", **tierkv}}
    return storage_config(extra, tp_rank=tp_rank, tp_size=tp_size, mla=mla, metrics=metrics)


def backend(layout: str, storage: MemoryStorage, **config: Any) -> tuple[TierKVStorage, Any]:
    _, host = host_pool(layout)
    b = TierKVStorage(pages_config(**config), {}, storage=storage)
    b.register_mem_pool_host(host)
    return b, host


@pytest.mark.parametrize("layout", LAYOUTS)
def test_byte_runs_are_the_page_in_c_order(layout: str) -> None:
    """The runs a transport receives into are exactly the page's bytes, in the order of the flat page."""
    _, host = host_pool(layout)
    indices = host.alloc(8)
    fill_random(host, indices, seed=3)
    view = host.get_data_page(4, flat=False)
    rows = byte_rows(view)
    assert rows is not None
    expected_runs = {"layer_first": 2 * 3, "page_first": 2, "page_first_direct": 2}[layout]
    assert len(rows) == expected_runs
    flat = host.get_data_page(4, flat=True).view(torch.uint8).numpy().tobytes()
    assert b"".join(bytes(r) for r in rows) == flat
    for r in rows:  # writing through the runs writes the pool
        r[:] = b"\x00" * len(r)
    assert not host.get_data_page(4, flat=True).view(torch.int16).any()
    assert page_bits(host, indices)[0].any(), "the page before it is untouched"


def same_pages(got: list[torch.Tensor], want: list[torch.Tensor], codec: str) -> bool:
    """Bit for bit for raw; within int8's rounding (absmax / 127 per group, here per page) for int8."""
    if codec == "raw":
        pairs = zip(got, want, strict=True)
        return all(torch.equal(g.view(torch.int16), w.view(torch.int16)) for g, w in pairs)
    return all(
        torch.allclose(g.float(), w.float(), rtol=0, atol=float(w.float().abs().max()) / 100)
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("codec", ["raw", "int8"])
def test_both_paths_read_and_write_the_same_blobs(layout: str, codec: str) -> None:
    storage = MemoryStorage()
    b, host = backend(layout, storage, codec=codec)
    keys = [f"page-{i}" for i in range(4)]
    indices = host.alloc(16)
    fill_random(host, indices, seed=5)
    if codec == "int8":  # int8 is for finite values: take them from a normal distribution
        for s in indices[:: host.page_size].tolist():
            page = host.get_data_page(int(s), flat=False)
            page.copy_(torch.randn(page.shape))
    want = [host.get_data_page(int(s), flat=True).clone() for s in indices[::4].tolist()]
    assert b.batch_set_v1(keys, indices) == [True] * 4
    got = b.batch_get(keys, [host.get_dummy_flat_data_page() for _ in keys])
    assert all(t is not None for t in got)
    assert same_pages(got, want, codec)
    # and back: the generic path's pages, read through the zero-copy path into fresh host pages
    assert b.batch_set([f"g-{k}" for k in keys], want)
    fresh = host.alloc(16)
    assert b.batch_get_v1([f"g-{k}" for k in keys], fresh) == [True] * 4
    assert same_pages([host.get_data_page(int(s)) for s in fresh[::4].tolist()], want, codec)


def test_store_carries_parents_from_prefix_keys() -> None:
    storage = MemoryStorage()
    b, host = backend("page_first", storage)
    indices = host.alloc(8)
    assert b.batch_set_v1(["c", "d"], indices, HiCacheStorageExtraInfo(prefix_keys=["a", "b"]))
    assert b.namespace is not None
    a, bb, c, d = page_keys(b.namespace, ["a", "b", "c", "d"])
    meta = storage.meta[("kv_cold", b.namespace.digest)]
    assert meta[c].parent == bb and meta[d].parent == c
    assert a not in meta


def test_namespace_carries_rank_layout_and_dtype() -> None:
    _, host = host_pool("layer_first")
    pool = PagePool(host)

    def ns(**ranks: Any) -> bytes:
        return page_namespace(pool, Ranks(**ranks), model="m", codec="raw", tenant="").digest

    assert ns(tp_rank=0, tp_size=2) != ns(tp_rank=1, tp_size=2)
    assert ns(tp_rank=0, tp_size=2, replicated=True) == ns(tp_rank=1, tp_size=2, replicated=True)
    assert ns(pp_rank=1, pp_size=2) != ns(pp_rank=0, pp_size=2)
    assert ns(cp_rank=1, cp_size=2) != ns(cp_rank=0, cp_size=2)
    _, other = host_pool("page_first")
    assert page_namespace(PagePool(other), Ranks(), model="m", codec="raw", tenant="").digest != ns()
    with pytest.raises(ConfigError, match="model_id"):
        page_namespace(pool, Ranks(), model="", codec="raw", tenant="")


def test_state_pools_tierkv_does_not_store_are_refused_with_a_clear_message() -> None:
    b, host = backend("layer_first", MemoryStorage())
    b.register_mem_host_pool_v2(host, PoolName.KV)
    with pytest.raises(ConfigError, match="the indexer pool is not supported"):
        b.register_mem_host_pool_v2(host, PoolName.INDEXER)


def test_bad_settings_name_the_key() -> None:
    with pytest.raises(ConfigError, match="hicache-storage-backend-extra-config: tierkv: codex: unknown key"):
        TierKVStorage(pages_config(codex="raw"), {}, storage=MemoryStorage())


def test_get_stats_reports_verified_pages_then_drains() -> None:
    storage = MemoryStorage()
    b, host = backend("page_first", storage, metrics=True)
    indices = host.alloc(12)
    assert b.batch_set_v1(["x", "y", "z"], indices) == [True] * 3
    assert b.namespace is not None
    storage.blobs[("kv_cold", b.namespace.digest)][page_keys(b.namespace, ["z"])[0]] = b"garbage"
    assert b.batch_get_v1(["x", "y", "z", "w"], host.alloc(16)) == [True, True, False, False]
    stats = b.get_stats()
    from sglang.srt.observability.metrics_collector import StorageMetrics

    assert isinstance(stats, StorageMetrics)
    assert stats.backup_pgs == [3] and stats.prefetch_pgs == [2]
    assert len(stats.backup_bandwidth) == 1 and stats.backup_bandwidth[0] > 0
    assert b.stats.totals.pages_rejected == 1 and b.stats.totals.pages_missed == 1
    assert b.get_stats().prefetch_pgs == []
    quiet, _ = backend("page_first", MemoryStorage())
    assert quiet.get_stats() is None
