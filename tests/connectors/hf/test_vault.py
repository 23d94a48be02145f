"""TieredSession against real vault processes: cold restores, store-on-evict, failures."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from tests.conftest import VaultFactory
from tests.connectors.hf.models import (
    ATTENTION_FAMILIES,
    HYBRID_FAMILIES,
    MORE_HYBRID_FAMILIES,
    family_params,
    prompt,
    reference,
    tiny_model,
)
from tierkv.client.cluster import Cluster
from tierkv.codec import LayerGroup
from tierkv.connectors.hf import TieredSession
from tierkv.connectors.hf.hot import TokenArray, as_tokens
from tierkv.vault.launcher import VaultProcess

NEW = 16
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def vaults(vault_factory: VaultFactory) -> tuple[VaultProcess, VaultProcess]:
    return vault_factory("kv", role="kv_cold"), vault_factory("ssm", role="ssm_cold")


@pytest.fixture
def cluster(vaults: tuple[VaultProcess, VaultProcess]) -> Iterator[Cluster]:
    kv, ssm = vaults
    c = Cluster({"kv_cold": [kv.address], "ssm_cold": [ssm.address]}, timeout=2.0)
    yield c
    c.close()


def _session(model: object, cluster: Cluster, **kwargs: object) -> TieredSession:
    kwargs.setdefault("block_size", 16)
    kwargs.setdefault("state_stride_blocks", 1)
    return TieredSession(model, cluster, **kwargs)  # type: ignore[arg-type]


class _Stored(NamedTuple):
    """A session that generated from ``ids`` and persisted the sequence to the vaults."""

    model: Any
    ids: torch.Tensor
    ref: torch.Tensor
    writer: TieredSession


def _store(family: str, cluster: Cluster, length: int, **kwargs: object) -> _Stored:
    model = tiny_model(family)
    ids = prompt(length)
    ref = reference(model, ids, NEW)
    writer = _session(model, cluster, **kwargs)
    assert torch.equal(writer.generate(ids, max_new_tokens=NEW), ref)
    assert writer.persist(timeout=30)
    assert writer.stored_blobs > 0
    return _Stored(model, ids, ref, writer)


def _flip_bits(
    cluster: Cluster, namespace: bytes, key: bytes, at: int | None, mask: int, role: str = "kv_cold"
) -> None:
    """Corrupt one stored blob in place: XOR ``mask`` into its byte ``at`` (``None``: the middle one)."""
    blob = bytearray(cluster.get(namespace, [key], role=role)[0] or b"")
    assert blob, "the blob to corrupt is not stored"
    blob[len(blob) // 2 if at is None else at] ^= mask
    assert cluster.put(namespace, {key: bytes(blob)}, role=role).stored == 1


def _check_cold_restore(family: str, cluster: Cluster) -> None:
    model, ids, ref, writer = _store(family, cluster, 45)

    # A new process-like session: empty hot tier, same vaults.
    reader = _session(model, cluster)
    out = reader.generate(ids, max_new_tokens=NEW)
    stats = reader.last_stats
    assert torch.equal(out, ref)
    assert stats.source == "cold" and stats.cold_hits == 32 and stats.restored_tokens == 32
    assert stats.bytes_fetched > 0 and stats.rejected_blobs == 0

    # A longer conversation restores the whole stored sequence (prompt + reply) from the vaults.
    longer = torch.cat([ref, prompt(7, seed=5)], dim=1)
    fresh = _session(model, cluster)
    out = fresh.generate(longer, max_new_tokens=NEW)
    assert torch.equal(out, reference(model, longer, NEW))
    # The writer cached 60 tokens: 3 whole blocks. A hybrid model also needs its recurrent state
    # at 48, snapshotted while decoding unless its decode path drifts from prefill.
    expected = 48 if writer.decode_snapshots or not writer.layout.has_states else 32
    assert fresh.last_stats.source == "cold" and fresh.last_stats.restored_tokens == expected


@pytest.mark.parametrize("family", family_params(ATTENTION_FAMILIES + HYBRID_FAMILIES))
def test_cold_restore_is_exact(family: str, cluster: Cluster) -> None:
    _check_cold_restore(family, cluster)


@pytest.mark.slow
@pytest.mark.parametrize("family", MORE_HYBRID_FAMILIES)
def test_cold_restore_is_exact_more_hybrids(family: str, cluster: Cluster) -> None:
    _check_cold_restore(family, cluster)


def test_hybrid_states_go_to_the_ssm_role(
    cluster: Cluster, vaults: tuple[VaultProcess, VaultProcess]
) -> None:
    kv, ssm = vaults
    kv_only = Cluster({"kv_cold": [kv.address]}, timeout=2.0)
    ssm_only = Cluster({"kv_cold": [ssm.address]}, timeout=2.0)  # read the ssm vault directly
    try:
        s = _session(tiny_model("qwen3_next"), cluster)
        ids = prompt(45)
        s.generate(ids, max_new_tokens=4)
        assert s.persist(timeout=30)
        tokens = _tokens(ids)
        kv_keys = s.streams.kv_keys(tokens, 2)
        state_keys = s.streams.state_keys(tokens, 2)
        at_32 = [state_keys[LayerGroup.SSM][1], state_keys[LayerGroup.CONV][1]]
        assert kv_only.prefix_lookup(s.namespace, kv_keys) == 2
        assert ssm_only.prefix_lookup(s.namespace, kv_keys) == 0
        assert all(b is not None for b in ssm_only.get(s.namespace, at_32))
        assert kv_only.get(s.namespace, at_32) == [None, None]
    finally:
        kv_only.close()
        ssm_only.close()


def _tokens(ids: torch.Tensor) -> TokenArray:
    return as_tokens(ids[0].numpy())


def test_hot_eviction_ships_blocks_a_later_request_restores(cluster: Cluster) -> None:
    model = tiny_model("qwen2")
    a, b = prompt(64, seed=1), prompt(64, seed=2)
    per_entry = (64 + 4 - 1) * TieredSession(model, None).layout.kv_bytes_per_token()
    s = _session(model, cluster, hot_bytes=per_entry + per_entry // 2)  # room for one entry

    s.generate(a, max_new_tokens=4)
    assert s.stored_blobs == 0  # nothing is written through
    s.generate(b, max_new_tokens=4)  # evicts a: its 4 whole blocks are shipped
    assert s.flush(timeout=30)
    assert s.hot.evictions == 1 and s.stored_blobs == 4

    out = s.generate(a, max_new_tokens=NEW)
    assert torch.equal(out, reference(model, a, NEW))
    assert s.last_stats.source == "cold" and s.last_stats.restored_tokens == 48  # 63 restorable -> 3 blocks


@pytest.mark.parametrize("family", ["llama", "falcon_h1"])
def test_cold_extends_a_shorter_hot_prefix(family: str, cluster: Cluster) -> None:
    model = tiny_model(family)
    long_prompt = prompt(80)
    writer = _session(model, cluster)
    writer.generate(long_prompt, max_new_tokens=2)
    writer.persist(timeout=30)

    s = _session(model, cluster)
    s.generate(long_prompt[:, :20], max_new_tokens=2)  # hot entry covering 21 tokens
    out = s.generate(long_prompt, max_new_tokens=NEW)
    stats = s.last_stats
    assert torch.equal(out, reference(model, long_prompt, NEW))
    assert stats.source == "hot+cold" and stats.hot_hits == 16 and stats.cold_hits == 48
    assert stats.cold_blocks == 3 and stats.restored_tokens == 64


def test_vault_killed_mid_session_still_generates_correctly(
    cluster: Cluster, vaults: tuple[VaultProcess, VaultProcess]
) -> None:
    stored = _store("qwen3", cluster, 50)
    vaults[0].kill()
    vaults[1].kill()
    s = _session(stored.model, cluster)
    for _ in range(2):  # the second call meets an open circuit breaker
        out = s.generate(stored.ids, max_new_tokens=NEW)
        assert torch.equal(out, stored.ref)
        s.hot.clear()
    assert s.last_stats.source == "none" and s.last_stats.computed_tokens == 50
    assert s.persist(timeout=30)  # stores to a dead vault are dropped, not raised


def test_corrupted_block_is_not_used(cluster: Cluster) -> None:
    stored = _store("llama", cluster, 60)
    writer = stored.writer
    keys = writer.streams.kv_keys(_tokens(stored.ids), 3)
    _flip_bits(cluster, writer.namespace, keys[1], None, 0x10)

    reader = _session(stored.model, cluster)
    out = reader.generate(stored.ids, max_new_tokens=NEW)
    assert torch.equal(out, stored.ref)
    stats = reader.last_stats
    assert stats.rejected_blobs == 1 and stats.restored_tokens == 16 and stats.computed_tokens == 44


def test_a_corrupted_block_is_deleted_and_the_next_store_replaces_it(cluster: Cluster) -> None:
    stored = _store("qwen2", cluster, 60)
    namespace = stored.writer.namespace
    keys = stored.writer.streams.kv_keys(_tokens(stored.ids), 3)
    _flip_bits(cluster, namespace, keys[1], -3, 0x20)

    reader = _session(stored.model, cluster)
    assert torch.equal(reader.generate(stored.ids, max_new_tokens=NEW), stored.ref)
    assert reader.last_stats.rejected_blobs == 1 and reader.last_stats.restored_tokens == 16
    assert cluster.get(namespace, keys)[1] is None, "the blob that failed verification is gone"
    assert cluster.prefix_lookup(namespace, keys) == 1

    assert reader.persist(timeout=30)  # ships the recomputed blocks the vaults lack
    assert cluster.prefix_lookup(namespace, keys) == 3
    again = _session(stored.model, cluster)
    assert torch.equal(again.generate(stored.ids, max_new_tokens=NEW), stored.ref)
    assert again.last_stats.rejected_blobs == 0 and again.last_stats.restored_tokens == 48


def test_corrupted_state_falls_back_to_an_earlier_boundary(cluster: Cluster) -> None:
    stored = _store("falcon_h1", cluster, 60, state_stride_blocks=2)
    writer = stored.writer
    state_keys = writer.streams.state_keys(_tokens(stored.ids), 3)
    key = state_keys[LayerGroup.SSM][2]  # the snapshot after 48 tokens
    _flip_bits(cluster, writer.namespace, key, -1, 0x01, role="ssm_cold")

    reader = _session(stored.model, cluster, state_stride_blocks=2)
    out = reader.generate(stored.ids, max_new_tokens=NEW)
    assert torch.equal(out, stored.ref)
    assert reader.last_stats.rejected_blobs == 1 and reader.last_stats.restored_tokens == 32


def test_hybrid_hit_needs_both_kv_and_state(
    cluster: Cluster, vaults: tuple[VaultProcess, VaultProcess]
) -> None:
    model, ids, ref, writer = _store("granitemoehybrid", cluster, 50)

    # Corrupt one KV block before the boundary: the state there cannot be used without it.
    keys = writer.streams.kv_keys(_tokens(ids), 3)
    _flip_bits(cluster, writer.namespace, keys[0], -2, 0x08)
    reader = _session(model, cluster)
    assert torch.equal(reader.generate(ids, max_new_tokens=NEW), ref)
    assert reader.last_stats.restored_tokens == 0 and reader.last_stats.rejected_blobs == 1

    # KV intact but the ssm_cold vault gone: no state, so no hit is claimed.
    writer.generate(ids, max_new_tokens=NEW)  # recomputed; shipping it again repairs block 0
    assert writer.persist(timeout=30)
    assert cluster.prefix_lookup(writer.namespace, keys) == 3
    vaults[1].kill()
    reader = _session(model, cluster)
    assert torch.equal(reader.generate(ids, max_new_tokens=NEW), ref)
    assert reader.last_stats.source == "none" and reader.last_stats.computed_tokens == 50


FIRST_PROCESS = """
import sys
from tests.connectors.hf.models import prompt, tiny_model
from tierkv.config import Config
from tierkv.connectors.hf import TieredSession
from tierkv.tiering import open_cluster

vaults = open_cluster(Config(), roles={"kv_cold": [sys.argv[1]]})
with TieredSession(tiny_model("llama"), vaults, block_size=16) as session:
    out = session.generate(prompt(45), max_new_tokens=16)
print(out[0].tolist())
"""


def test_a_closed_session_is_restored_by_the_next_process(vault_factory: VaultFactory) -> None:
    """Leaving ``with TieredSession(...)`` persists the hot tier: a fresh process restores from the vault."""
    vault = vault_factory("kv", role="kv_cold")
    first = subprocess.run(
        [sys.executable, "-c", FIRST_PROCESS, vault.address],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    written = json.loads(first.stdout.strip().splitlines()[-1])
    c = Cluster({"kv_cold": [vault.address]}, timeout=2.0)
    try:
        with TieredSession(tiny_model("llama"), c, block_size=16) as again:
            out = again.generate(prompt(45), max_new_tokens=16)
            stats = again.last_stats
    finally:
        c.close()
    assert stats.source == "cold" and stats.restored_tokens == 32 and stats.cold_hits == 32
    assert out[0].tolist() == written


def test_close_without_persist_leaves_the_vaults_alone(cluster: Cluster) -> None:
    s = _session(tiny_model("llama"), cluster)
    s.generate(prompt(45), max_new_tokens=4)
    s.close(persist=False)
    assert s.stored_blobs == 0 and len(s.hot) == 1
