"""SGLang's ``batch_*_v2`` for hybrid models against real vaults: KV pages in ``kv_cold``, Mamba states
(SGLang's own ``MambaPoolHost`` on CPU) in ``ssm_cold``, with SGLang's hit policies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("sglang", reason="SGLang is not installed here (make test-sglang builds .venv-sglang)")

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.storage import StorageBackendFactory

from tests.conftest import VaultFactory
from tests.connectors.sglang.harness import (
    fill_random,
    host_pool,
    mamba_host_pool,
    page_hashes,
    storage_config,
    tierkv_extra,
)
from tests.processes import stopped
from tierkv.vault.launcher import VaultProcess

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(600)]

KEYS = page_hashes(list(range(300, 324)), 4)  # six pages of four tokens
STATE_AT = (2, 5)  # states checkpointed after the third and the sixth page


class Hybrid:
    """One backend with a KV host pool and a Mamba host pool registered the way SGLang's hybrid
    controller registers them; KV pages and states stored for ``KEYS``."""

    def __init__(self, kv_cold: VaultProcess, ssm_cold: VaultProcess) -> None:
        self.ssm_vault = ssm_cold
        extra = tierkv_extra([kv_cold.address], v1=True, timeout=0.5, ssm_cold=ssm_cold.address)
        config = storage_config(extra, page_first=True, model="tiny-hybrid")
        _, self.kv_host = host_pool("page_first")
        self.mamba = mamba_host_pool()
        self.backend = StorageBackendFactory.create_backend("dynamic", config, self.kv_host)
        self.backend.register_mem_pool_host(self.kv_host)
        self.backend.register_mem_host_pool_v2(self.kv_host, PoolName.KV)
        self.backend.register_mem_host_pool_v2(self.mamba, PoolName.MAMBA)
        self.backend.on_host_pools_registered()
        kv_at = self.kv_host.alloc(len(KEYS) * 4)
        fill_random(self.kv_host, kv_at, seed=1)
        assert self.backend.batch_set_v1(KEYS, kv_at) == [True] * len(KEYS)
        self.slots = self.mamba.alloc(len(STATE_AT))
        self.states = {}
        for slot, page in zip(self.slots.tolist(), STATE_AT, strict=True):
            size = self.mamba.get_data_page(slot).numel()  # a state page is its bytes
            self.mamba.set_from_flat_data_page(slot, torch.randint(0, 256, (size,), dtype=torch.uint8))
            self.states[page] = self.mamba.get_data_page(slot).clone()
            stored = self.backend.batch_set_v2(
                [self.transfer([KEYS[page]], torch.tensor([slot]))],
                HiCacheStorageExtraInfo(prefix_keys=KEYS[:page]),
            )
            assert stored == {PoolName.MAMBA: [True]}

    @staticmethod
    def transfer(keys: list[str], slots: torch.Tensor | None = None, policy: Any = None) -> Any:
        return PoolTransfer(
            name=PoolName.MAMBA,
            host_indices=slots,
            keys=keys,
            hit_policy=policy or PoolHitPolicy.TRAILING_PAGES,
        )

    def exists(self, policy: Any = None) -> Any:
        return self.backend.batch_exists_v2(KEYS, [self.transfer([KEYS[-1]], policy=policy)])


@pytest.fixture
def hybrid(vault_factory: VaultFactory) -> Iterator[Hybrid]:
    h = Hybrid(vault_factory("kv"), vault_factory("ssm"))
    yield h
    h.backend.close()


def test_trailing_states_make_their_prefixes_restorable(hybrid: Hybrid) -> None:
    result = hybrid.exists()
    assert result.kv_hit_pages == 6
    assert result.restorable_prefix_pages == [3, 6]
    assert result.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.MAMBA: 6}


def test_states_live_in_the_ssm_cold_vaults(hybrid: Hybrid) -> None:
    stream = hybrid.backend.sidecars["mamba"]
    key = stream.keys([KEYS[5]])
    storage, ns = hybrid.backend.storage, stream.spec.namespace
    assert stream.spec.role == "ssm_cold"
    assert storage.get_buffers(ns, key, role="ssm_cold")[0] is not None
    assert storage.get_buffers(ns, key, role="kv_cold")[0] is None


def test_a_state_comes_back_bit_for_bit_into_another_slot(hybrid: Hybrid) -> None:
    slot = hybrid.mamba.alloc(1)
    got = hybrid.backend.batch_get_v2([hybrid.transfer([KEYS[5]], slot)])
    assert got == {PoolName.MAMBA: [True]}
    assert torch.equal(hybrid.mamba.get_data_page(int(slot[0])), hybrid.states[5])
    missing = hybrid.backend.batch_get_v2([hybrid.transfer([KEYS[4]], hybrid.mamba.alloc(1))])
    assert missing == {PoolName.MAMBA: [False]}
    short = hybrid.backend.batch_get_v2([hybrid.transfer([KEYS[5], KEYS[2]], slot)])
    assert short == {PoolName.MAMBA: [False, False]}, "indices that do not cover the keys move nothing"


def test_a_deleted_state_shortens_the_prefix(hybrid: Hybrid) -> None:
    stream = hybrid.backend.sidecars["mamba"]
    assert hybrid.backend.storage.delete(stream.spec.namespace, stream.keys([KEYS[5]]), role="ssm_cold") == 1
    result = hybrid.exists()
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (3, [3])


def test_hit_policies(hybrid: Hybrid) -> None:
    assert hybrid.exists(PoolHitPolicy.ALL_PAGES).kv_hit_pages == 0, "no state for the first page"
    assert hybrid.exists(PoolHitPolicy.BLOCK_GROUPS).kv_hit_pages == 0, "not offered: no hit"


def test_a_hung_ssm_vault_is_a_miss_for_the_states_only(hybrid: Hybrid) -> None:
    with stopped(hybrid.ssm_vault):
        result = hybrid.exists()
        assert (result.kv_hit_pages, result.restorable_prefix_pages) == (0, [])
        assert hybrid.backend.batch_exists(KEYS) == 6, "the KV pages are still found"
