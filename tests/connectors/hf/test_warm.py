"""TieredSession and warm starts, on a real vault: with ``warm_tokens`` every stored block carries its
token ids (without a layout too; without the setting nothing changes), and ``warm()`` fills a fresh
session's hot tier from the vault's hottest chains, so the first request is served from it."""

from __future__ import annotations

import torch

from tests.conftest import VaultFactory
from tests.connectors.hf.models import prompt, reference, tiny_model
from tierkv.client.cluster import Cluster
from tierkv.connectors.hf import TieredSession
from tierkv.connectors.hf.hot import as_tokens
from tierkv.retention import Retention
from tierkv.tiering import MemoryStorage

BS = 16


def test_warm_tokens_ship_each_blocks_ids_even_without_a_layout() -> None:
    model = tiny_model("llama")
    storage = MemoryStorage()
    session = TieredSession(model, storage, block_size=BS, retention=Retention(warm_tokens=True))
    out = session.generate(prompt(40), max_new_tokens=9)
    assert session.persist(timeout=60)
    keys = session.streams.kv_keys(as_tokens(out[0].numpy()), 3)
    meta = storage.meta[("kv_cold", session.namespace)]
    ids = out[0].tolist()
    assert [meta[k].tokens for k in keys] == [tuple(ids[i * BS : (i + 1) * BS]) for i in range(3)]
    assert [meta[k].parent for k in keys] == [b"", *keys[:2]] and not any(meta[k].tagged for k in keys)


def test_warm_fills_the_hot_tier_from_the_vaults_hottest_chains(vault_factory: VaultFactory) -> None:
    vault = vault_factory()
    model = tiny_model("llama")
    rules = Retention(warm_tokens=True)
    ids = prompt(64)
    with Cluster({"kv_cold": vault.address}, timeout=10) as cluster:
        first = TieredSession(model, cluster, block_size=BS, retention=rules)
        first.generate(ids, max_new_tokens=1)
        assert first.persist(timeout=60)
        again = TieredSession(model, cluster, block_size=BS, retention=rules)
        again.generate(ids, max_new_tokens=1)  # a restore from the vault: the chain gets its hits
        assert again.last_stats.source == "cold"

        fresh = TieredSession(model, cluster, block_size=BS, retention=rules)
        assert fresh.warm() == 1
        (entry,) = fresh.hot.entries()
        assert entry.tokens.tolist() == ids[0, :64].tolist()
        out = fresh.generate(ids, max_new_tokens=4)
        assert fresh.last_stats.source == "hot" and fresh.last_stats.restored_tokens == 63
        assert torch.equal(out, reference(model, ids, 4))

        cold = TieredSession(model, cluster, block_size=BS)  # reading what the vault has needs no setting
        assert cold.warm() == 1 and TieredSession(model, None, block_size=BS).warm() == 0


def test_warm_restores_coldest_first_and_skips_what_the_hot_tier_covers(vault_factory: VaultFactory) -> None:
    vault = vault_factory()
    model = tiny_model("llama")
    rules = Retention(warm_tokens=True)
    hot_ids, cool_ids = prompt(48, seed=1), prompt(48, seed=2)
    with Cluster({"kv_cold": vault.address}, timeout=10) as cluster:
        first = TieredSession(model, cluster, block_size=BS, retention=rules)
        for ids in (hot_ids, cool_ids):
            first.generate(ids, max_new_tokens=1)
        assert first.persist(timeout=60)
        for ids in (hot_ids, cool_ids, hot_ids):  # restores from the vault: hot_ids gets more hits
            TieredSession(model, cluster, block_size=BS, retention=rules).generate(ids, max_new_tokens=1)

        fresh = TieredSession(model, cluster, block_size=BS, retention=rules)
        assert fresh.warm() == 2
        order = [e.tokens.tolist() for e in fresh.hot.eviction_order()]
        assert order == [cool_ids[0].tolist(), hot_ids[0].tolist()]  # the hottest is restored last
        assert fresh.warm() == 0  # both chains are already in the hot tier
