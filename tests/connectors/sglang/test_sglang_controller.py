"""SGLang's HiCacheController, its threads and its storage factory against real vault processes on
loopback: the backend is loaded by module path (``dynamic``), pages go through the controller's own
backup and prefetch threads (generic and zero-copy functions) and come back bit for bit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("sglang", reason="SGLang is not installed here (make test-sglang builds .venv-sglang)")

import torch
from sglang.srt.mem_cache.storage import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str, storage_namespace_seed

from tests.connectors.sglang.harness import (
    LAYOUTS,
    Node,
    fill_random,
    host_pool,
    mla_host_pool,
    page_bits,
    page_hashes,
    storage_config,
    tierkv_extra,
)
from tests.processes import stopped
from tierkv.connectors.sglang.pages import page_keys
from tierkv.vault.launcher import VaultProcess

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(600)]

TOKENS = list(range(100, 124))  # 6 pages of 4 tokens
PAGES = 6


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    """Nodes a test builds; each one's storage threads stopped and backend closed at teardown."""
    made: list[Node] = []
    yield made
    for node in made:
        node.close()


def make(nodes: list[Node], layout: str, vault: VaultProcess, *, v1: bool, **extra: Any) -> Node:
    node = Node(layout, "dynamic", tierkv_extra([vault.address], v1=v1, **extra))
    nodes.append(node)
    return node


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("v1", [False, True], ids=["generic", "zero_copy"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pages_round_trip_through_the_controller(
    layout: str, v1: bool, vault: VaultProcess, nodes: list[Node]
) -> None:
    node = make(nodes, layout, vault, v1=v1)
    zero_copy = node.cc.page_get_func == node.cc._page_get_zero_copy
    assert zero_copy == v1 and (node.cc.page_set_func == node.cc._page_set_zero_copy) == v1
    stored_at, stored = node.backup(TOKENS, seed=1)
    assert stored == len(TOKENS)
    loaded_at, reported, loaded = node.prefetch(TOKENS)
    assert (reported, loaded) == (len(TOKENS), len(TOKENS))
    assert not set(loaded_at.tolist()) & set(stored_at.tolist()), "loaded into other host pages"
    assert same(page_bits(node.host, loaded_at), page_bits(node.host, stored_at))
    totals = node.backend.stats.totals
    assert (totals.pages_stored, totals.pages_loaded, totals.pages_missed) == (PAGES, PAGES, 0)
    assert totals.pages_landed == PAGES, "received straight into the pages, nothing copied after the socket"


def test_pages_stored_generic_load_zero_copy_in_another_instance(
    vault: VaultProcess, nodes: list[Node]
) -> None:
    """Same blobs on both paths, and SGLang's page hashes are the same in a fresh controller."""
    writer = make(nodes, "page_first", vault, v1=False)
    stored_at, _ = writer.backup(TOKENS, seed=2)
    reader = make(nodes, "page_first", vault, v1=True)
    loaded_at, _, loaded = reader.prefetch(TOKENS)
    assert loaded == len(TOKENS)
    assert same(page_bits(reader.host, loaded_at), page_bits(writer.host, stored_at))
    other_layout = make(nodes, "layer_first", vault, v1=True)
    assert other_layout.prefetch(TOKENS)[1] == 0, "a page in another layout is another namespace"


def test_a_salted_chain_is_another_chain(vault: VaultProcess, nodes: list[Node]) -> None:
    node = make(nodes, "page_first", vault, v1=True)
    seed = storage_namespace_seed(None, "tenant-salt")
    indices = node.host.alloc(len(TOKENS))
    fill_random(node.host, indices, seed=3)
    salted = list(get_hash_str(TOKENS, seed, page_size=4))
    assert salted != page_hashes(TOKENS, 4)
    assert node.backend.batch_set_v1(salted, indices) == [True] * PAGES
    assert node.prefetch(TOKENS)[1] == 0
    assert node.backend.batch_exists(salted) == PAGES


def test_a_deleted_page_ends_the_prefix(vault: VaultProcess, nodes: list[Node]) -> None:
    node = make(nodes, "layer_first", vault, v1=True)
    stored_at, _ = node.backup(TOKENS, seed=4)
    backend = node.backend
    keys = page_keys(backend.namespace, page_hashes(TOKENS, 4))
    assert backend.storage.delete(backend.namespace.digest, keys[3:4]) == 1
    loaded_at, reported, loaded = node.prefetch(TOKENS)
    assert (reported, loaded) == (12, 12)
    assert same(page_bits(node.host, loaded_at), page_bits(node.host, stored_at)[:3])


@pytest.mark.parametrize("v1", [False, True], ids=["generic", "zero_copy"])
def test_a_corrupt_page_is_a_miss_and_is_deleted(v1: bool, vault: VaultProcess, nodes: list[Node]) -> None:
    node = make(nodes, "page_first", vault, v1=v1)
    stored_at, _ = node.backup(TOKENS, seed=5)
    backend = node.backend
    ns = backend.namespace.digest
    key = page_keys(backend.namespace, page_hashes(TOKENS, 4))[2]
    (blob,) = backend.storage.get_buffers(ns, [key])
    flipped = bytearray(blob)
    flipped[-1] ^= 0x40  # one bit of the payload: the checksum no longer matches
    backend.storage.put(ns, {key: bytes(flipped)})
    assert bytes(backend.storage.get_buffers(ns, [key])[0]) == bytes(flipped), "the vault holds the flip"
    loaded_at, reported, loaded = node.prefetch(TOKENS)
    assert reported == len(TOKENS), "the vault still held all six pages when asked"
    assert loaded == 8, "the prefetch stops at the corrupt third page"
    assert same(page_bits(node.host, loaded_at)[:2], page_bits(node.host, stored_at)[:2])
    assert backend.stats.totals.pages_rejected == 1
    assert backend.batch_exists(page_hashes(TOKENS, 4)) == 2, "the corrupt page was deleted"


def test_a_stopped_vault_is_a_miss_and_the_threads_go_on(vault: VaultProcess, nodes: list[Node]) -> None:
    node = make(nodes, "page_first", vault, v1=True, timeout=0.5)
    node.backup(TOKENS, seed=6)
    vault.stop()
    assert node.backup(list(range(500, 516)), seed=7)[1] == 0
    assert node.prefetch(TOKENS)[1:] == (0, 0)
    threads = [node.cc.prefetch_thread, node.cc.backup_thread, node.cc.prefetch_io_aux_thread]
    assert all(t.is_alive() for t in threads)


@pytest.mark.parametrize("v1", [False, True], ids=["generic", "zero_copy"])
def test_a_hung_vault_never_holds_the_threads_past_the_deadline(
    v1: bool, vault: VaultProcess, nodes: list[Node]
) -> None:
    """SIGSTOPped: the vault accepts connections and never answers. Every call returns a miss within the
    cluster's deadline (0.5 s here; the bound allows for a retry and a loaded machine)."""
    node = make(nodes, "layer_first", vault, v1=v1, timeout=0.5)
    node.backup(TOKENS, seed=8)
    with stopped(vault):
        t0 = time.monotonic()
        assert node.backup(list(range(600, 616)), seed=9)[1] == 0
        backup_s = time.monotonic() - t0
        t0 = time.monotonic()
        assert node.prefetch(TOKENS)[1:] == (0, 0)
        prefetch_s = time.monotonic() - t0
    assert backup_s < 5.0 and prefetch_s < 5.0, (backup_s, prefetch_s)
    assert node.prefetch(TOKENS)[1:] == (len(TOKENS), len(TOKENS)), "served again once it resumes"


def vault_config(tp_rank: int, address: str, *, mla: bool = False) -> Any:
    return storage_config(tierkv_extra([address], v1=True), tp_rank=tp_rank, tp_size=2, mla=mla)


def test_tp_ranks_keep_their_own_pages(vault: VaultProcess) -> None:
    """Two TP ranks hash the same tokens to the same page keys; each finds only its own shard."""
    ranks = []
    for rank in (0, 1):
        _, host = host_pool("page_first")
        backend = StorageBackendFactory.create_backend("dynamic", vault_config(rank, vault.address), host)
        backend.register_mem_pool_host(host)
        ranks.append((backend, host))
    keys = page_hashes(TOKENS, 4)
    try:
        (b0, h0), (b1, h1) = ranks
        at0, at1 = h0.alloc(len(TOKENS)), h1.alloc(len(TOKENS))
        fill_random(h0, at0, seed=10)
        assert b0.batch_set_v1(keys, at0) == [True] * PAGES
        assert b1.batch_exists(keys) == 0
        fill_random(h1, at1, seed=11)
        assert b1.batch_set_v1(keys, at1) == [True] * PAGES
        back0, back1 = h0.alloc(len(TOKENS)), h1.alloc(len(TOKENS))
        assert b0.batch_get_v1(keys, back0) == [True] * PAGES
        assert b1.batch_get_v1(keys, back1) == [True] * PAGES
        assert same(page_bits(h0, back0), page_bits(h0, at0))
        assert same(page_bits(h1, back1), page_bits(h1, at1))
        assert not same(page_bits(h0, back0), page_bits(h1, back1))
    finally:
        for backend, _ in ranks:
            backend.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mla_pages_are_one_copy_for_every_tp_rank(layout: str, vault: VaultProcess) -> None:
    """MLA's latent KV is the same on every TP rank: rank 0 writes it, rank 1 reads the same pages."""
    ranks = []
    for rank in (0, 1):
        host = mla_host_pool(layout)
        config = vault_config(rank, vault.address, mla=True)
        assert config.is_storage_writer == (rank == 0)
        backend = StorageBackendFactory.create_backend("dynamic", config, host)
        backend.register_mem_pool_host(host)
        ranks.append((backend, host))
    keys = page_hashes(TOKENS, 4)
    try:
        (b0, h0), (b1, h1) = ranks
        at0 = h0.alloc(len(TOKENS))
        fill_random(h0, at0, seed=12)
        assert b0.batch_set_v1(keys, at0) == [True] * PAGES
        assert b1.batch_exists(keys) == PAGES
        back = h1.alloc(len(TOKENS))
        assert b1.batch_get_v1(keys, back) == [True] * PAGES
        assert same(page_bits(h1, back), page_bits(h0, at0))
    finally:
        for backend, _ in ranks:
            backend.close()


def test_the_factory_refuses_a_bad_setting() -> None:
    _, host = host_pool("page_first")
    config = vault_config(0, "127.0.0.1:1")
    config.extra_config["tierkv"]["lookup_lease_ms"] = 60_000
    with pytest.raises(Exception, match="tierkv: lookup_lease_ms"):
        StorageBackendFactory.create_backend("dynamic", config, host)
