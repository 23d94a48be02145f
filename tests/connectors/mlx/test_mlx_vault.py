"""MlxTier through real vault processes on loopback: cold restores bit-identical to a full prefill.

Every check compares greedy tokens and the log-probabilities of every step, bit for bit, with mlx-lm's
own ``generate_step`` over the whole prompt in a fresh cache. The reader is a new ``MlxTier`` over a new
cluster connection, so nothing but the vaults carries state from the writer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip(
    "mlx.core", reason="mlx is not installed here (scripts/setup-mlx-env.sh builds .venv-mlx)"
)

from tests.conftest import VaultFactory
from tests.connectors.mlx.models import FAMILIES, Run, prompt, run, tiny_model
from tierkv.client.cluster import Cluster
from tierkv.connectors.mlx import MlxTier
from tierkv.vault.launcher import VaultProcess

pytestmark = pytest.mark.mlx

BLOCK = 16


@pytest.fixture
def vaults(vault_factory: VaultFactory) -> tuple[VaultProcess, VaultProcess]:
    return vault_factory("kv", role="kv_cold"), vault_factory("ssm", role="ssm_cold")


def _cluster(vaults: tuple[VaultProcess, VaultProcess]) -> Cluster:
    kv, ssm = vaults
    return Cluster({"kv_cold": [kv.address], "ssm_cold": [ssm.address]}, timeout=2.0)


@pytest.fixture
def cluster(vaults: tuple[VaultProcess, VaultProcess]) -> Iterator[Cluster]:
    c = _cluster(vaults)
    yield c
    c.close()


def _tier(model: Any, cluster: Cluster) -> MlxTier:
    return MlxTier(model, cluster, block_size=BLOCK, snapshot_every=2)


def _store(
    family: str, cluster: Cluster, length: int = 70, dtype: str = "float32"
) -> tuple[Any, list[int], Run]:
    model = tiny_model(family, dtype)
    ids = prompt(length)
    ref = run(model, ids)
    writer = _tier(model, cluster)
    prepared = writer.prepare(ids)
    assert run(model, prepared.remaining.tolist(), prepared.cache).same_as(ref)
    tally = writer.store(prepared, ref.tokens)
    assert tally.stored == tally.sent > 0
    return model, ids, ref


def _restore(model: Any, cluster: Cluster, ids: list[int]) -> tuple[int, int, Run]:
    prepared = _tier(model, cluster).prepare(ids)
    return prepared.restored, prepared.rejected, run(model, prepared.remaining.tolist(), prepared.cache)


@pytest.mark.parametrize("family", FAMILIES)
def test_cold_restore_is_bit_identical_to_a_full_prefill(
    family: str, cluster: Cluster, vaults: tuple[VaultProcess, VaultProcess]
) -> None:
    model, ids, ref = _store(family, cluster)
    reader = _cluster(vaults)
    try:
        restored, rejected, out = _restore(model, reader, ids)
    finally:
        reader.close()
    assert (restored, rejected) == (64, 0)
    assert out.same_as(ref)


def test_bfloat16_llama_restores_bit_identically(cluster: Cluster) -> None:
    model, ids, ref = _store("llama", cluster, dtype="bfloat16")
    restored, _, out = _restore(model, cluster, ids)
    assert restored == 64 and out.same_as(ref)


def test_a_longer_prompt_reuses_the_stored_prefix(cluster: Cluster) -> None:
    model, ids, _ = _store("llama_swa", cluster)
    longer = ids + prompt(30, seed=3)
    restored, _, out = _restore(model, cluster, longer)
    assert restored == 64
    assert out.same_as(run(model, longer))


@pytest.mark.parametrize(
    ("family", "role", "position"), [("llama", "kv_cold", 16), ("mamba", "ssm_cold", 64)]
)
def test_corrupt_blob_in_a_vault_is_recomputed_and_deleted(
    family: str, role: str, position: int, cluster: Cluster
) -> None:
    model, ids, ref = _store(family, cluster)
    tier = _tier(model, cluster)
    ns = tier.namespace.digest
    if role == "kv_cold":
        key = tier.kv_keys(ids, 1)[0]
    else:
        from tierkv.connectors.mlx.hook import part_key

        key = part_key(tier.snapshot_keys(ids, position // BLOCK)[-1], 1)
    blob = bytearray(cluster.get(ns, [key], role=role)[0] or b"")
    assert blob, "the blob to corrupt is not stored"
    blob[len(blob) // 2] ^= 0x10
    assert cluster.put(ns, {key: bytes(blob)}, role=role).stored == 1
    restored, rejected, out = _restore(model, cluster, ids)
    assert rejected == 1 and restored < 64
    assert out.same_as(ref)
    assert cluster.get(ns, [key], role=role) == [None]


@pytest.mark.parametrize(("family", "victim"), [("llama", 0), ("llama_swa", 1)])
def test_killed_vault_means_recompute_with_identical_output(
    family: str, victim: int, cluster: Cluster, vaults: tuple[VaultProcess, VaultProcess]
) -> None:
    model, ids, ref = _store(family, cluster)
    vaults[victim].kill()
    restored, _, out = _restore(model, cluster, ids)
    assert restored == 0
    assert out.same_as(ref)
