"""The tiered ``KVPrefixCache`` over real vault processes, driven like EXO drives its cache: look up with
``get_kv_cache``, prefill and generate with mlx-lm, insert with ``add_kv_cache``. EXO itself cannot be
installed here (Python 3.13 and a Rust module), so the subclass is built over the stand-in in
``standin.py`` (EXO 0.3.68's signatures and contract, an entry count instead of a memory threshold).
Restored generations must be bit-identical to a full prefill of a random-weight llama."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip(
    "mlx.core", reason="mlx is not installed here (scripts/setup-mlx-env.sh builds .venv-mlx)"
)

import mlx.core as mx

from tests.conftest import VaultFactory
from tests.connectors.exo import standin
from tests.connectors.mlx.models import prompt, run, tiny_model
from tierkv.client.cluster import Cluster
from tierkv.connectors.exo.adapter import agree, rank_tenant, tiered_prefix_cache
from tierkv.tiering.memory import MemoryStorage

pytestmark = pytest.mark.mlx

BLOCK = 16


@pytest.fixture
def cluster(vault_factory: VaultFactory) -> Iterator[Cluster]:
    kv, ssm = vault_factory("kv", role="kv_cold"), vault_factory("ssm", role="ssm_cold")
    c = Cluster({"kv_cold": [kv.address], "ssm_cold": [ssm.address]}, timeout=2.0)
    yield c
    c.close()


def _serve(
    prefix_cache: Any, model: Any, ids: list[int], snapshot_at: int = 64
) -> tuple[Any, int | None, int]:
    """One EXO request: look up, generate on what is left, insert the prompt's cache. Like EXO's prefill,
    it snapshots the non-trimmable layers along the way (here at ``snapshot_at`` tokens)."""
    tokens = mx.array(ids)
    cache, remaining, index, _ = prefix_cache.get_kv_cache(model, tokens)
    reused = len(ids) - len(remaining)
    snapshots = None
    if standin.has_non_kv_caches(cache) and reused < snapshot_at < len(ids):
        model(tokens[reused:snapshot_at][None], cache=cache)
        mx.eval([c.state for c in cache])
        snapshots = [standin.snapshot_ssm_states(cache)]
        remaining = tokens[snapshot_at:]
    result = run(model, remaining.tolist(), cache)
    prefix_cache.add_kv_cache(tokens, cache, snapshots)
    return result, index, reused


@pytest.mark.parametrize("family", ["llama", "llama_swa", "qwen3_next"])
def test_evicted_entry_comes_back_from_the_vaults_bit_identical(cluster: Cluster, family: str) -> None:
    model = tiny_model(family)
    cls = tiered_prefix_cache(standin, storage=lambda: cluster, block_size=BLOCK)
    writer = cls(None)
    first, other, third = prompt(70, seed=1), prompt(70, seed=2), prompt(70, seed=3)
    for ids in (first, other, third):  # the third insert evicts the first (CAPACITY 2)
        _serve(writer, model, ids)
    assert all(p.tolist() != first for p in writer.prompts)
    tier = writer._tierkv.tier
    stored = [tier.blocks.lookup(tier.kv_spec, tier.kv_keys(ids, 4)) for ids in (first, other, third)]
    assert stored == [4, 0, 0]  # only the evicted entry was shipped
    if tier.layout.has_snapshots:  # with its snapshot at 64 tokens
        assert tier.restore(first).restored == 64 and tier.restore(other).restored == 0

    follow_up = [*first, *prompt(20, seed=4)]
    ref = run(model, follow_up)
    reader = cls(None)  # a fresh cache: only the vaults hold the first prompt
    got, index, reused = _serve(reader, model, follow_up, snapshot_at=80)
    assert got.same_as(ref)
    assert reused == 64 and index == 0  # four blocks restored, re-inserted through add_kv_cache
    assert len(reader.prompts) == len(reader.prefill_tps) == len(reader._last_used) == 2

    again, index, reused = _serve(reader, model, follow_up)
    hot = 80 if tier.layout.has_snapshots else len(follow_up) - 1  # back to the snapshot, as in EXO
    assert again.same_as(ref) and index == 1 and reused == hot  # a hot hit now


def test_no_vault_data_is_a_plain_miss() -> None:
    model = tiny_model("llama")
    cache = tiered_prefix_cache(standin, storage=MemoryStorage, block_size=BLOCK)(None)
    ids = prompt(50, seed=5)
    got, index, reused = _serve(cache, model, ids)
    assert got.same_as(run(model, ids)) and index is None and reused == 0


def test_quantized_exo_cache_is_tiered_through_exos_own_cache_factory(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model("qwen2_hd32")
    monkeypatch.setattr(standin, "KV_CACHE_BITS", 4)
    cls = tiered_prefix_cache(standin, storage=lambda: cluster, block_size=BLOCK)
    writer = cls(None)
    first = prompt(70, seed=1)
    for seed in (1, 2, 3):  # the third insert evicts the first
        _serve(writer, model, prompt(70, seed=seed))
    assert writer._tierkv.tier is not None and writer._tierkv.tier.layout.quantized
    follow_up = [*first, *prompt(20, seed=4)]
    got, index, reused = _serve(cls(None), model, follow_up)
    assert reused == 64 and index == 0
    assert got.same_as(run(model, follow_up, standin.make_kv_cache(model)))


def test_quantized_exo_without_a_cache_factory_leaves_the_adapter_off(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model("llama_hd32")
    monkeypatch.setattr(standin, "KV_CACHE_BITS", 4)
    monkeypatch.delattr(standin, "make_kv_cache")
    cache = tiered_prefix_cache(standin, storage=lambda: cluster, block_size=BLOCK)(None)
    cache._tierkv.tier_for(model)
    assert cache._tierkv.disabled and cache._tierkv.tier is None


def test_ranks_get_their_own_namespace_and_must_agree() -> None:
    class Group:
        def __init__(self, rank: int) -> None:
            self._rank = rank

        def rank(self) -> int:
            return self._rank

        def size(self) -> int:
            return 2

    assert rank_tenant(None) == "" and rank_tenant(Group(1)) == "exo-rank1-of-2"
    assert agree(None, 48) == 48
    world = mx.distributed.init()  # a one-process group: the collective runs, every rank agrees
    assert agree(world, 48) == 48 and agree(world, 0) == 0
