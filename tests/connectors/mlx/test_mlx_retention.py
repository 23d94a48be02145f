"""MlxTier.store with a prompt layout: KV blocks and snapshot parts carry the layout's tags."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip(
    "mlx.core", reason="mlx is not installed here (scripts/setup-mlx-env.sh builds .venv-mlx)"
)

from tests.conftest import VaultFactory
from tests.connectors.mlx.models import prompt, run, tiny_model
from tierkv.client.cluster import Cluster
from tierkv.client.vault import VaultClient
from tierkv.connectors.mlx import MlxTier
from tierkv.retention import GENERATION, LayoutError, Retention
from tierkv.tiering import MemoryStorage
from tierkv.tiering.storage import Storage

pytestmark = pytest.mark.mlx

BLOCK = 16
LAYOUT = [{"tokens": [0, 20], "source": "axioms"}, {"tokens": [20, 40], "source": "tools"}]


def store(family: str, storage: Storage, layout: Any) -> tuple[MlxTier, list[int]]:
    """Prepare a 40-token prompt, generate 30 tokens, store with ``layout``; the stored tokens."""
    model = tiny_model(family)
    tier = MlxTier(model, storage, block_size=BLOCK, snapshot_every=1)
    prepared = tier.prepare(prompt(40))
    generated = run(model, prepared.remaining.tolist(), prepared.cache, new=30).tokens
    tally = tier.store(prepared, generated, layout=layout)
    assert tally.stored == tally.sent > 0
    return tier, prepared.tokens + generated


def test_kv_blocks_take_the_layout_and_generated_tokens_are_generation() -> None:
    storage = MemoryStorage()
    tier, tokens = store("llama", storage, LAYOUT)
    keys = tier.kv_keys(tokens, 4)
    meta = storage.meta[("kv_cold", tier.namespace.digest)]
    assert set(meta) == set(keys) == set(storage.blobs[("kv_cold", tier.namespace.digest)])
    assert [meta[k].source for k in keys] == ["axioms", "axioms", "tools", GENERATION]
    assert [meta[k].parent for k in keys] == [b"", *keys[:3]]


def test_snapshot_parts_take_the_tag_of_the_block_they_end_and_no_parent() -> None:
    storage = MemoryStorage()
    layout = [{"tokens": [0, 16], "source": "axioms"}, {"tokens": [16, 40], "source": "tools"}]
    tier, _ = store("qwen3_next", storage, layout)
    parts = storage.meta[("ssm_cold", tier.namespace.digest)]
    assert set(parts) == set(storage.blobs[("ssm_cold", tier.namespace.digest)])
    assert {m.source for m in parts.values()} == {"axioms", "tools"}, "snapshots at tokens 16 and 32"
    assert all(m.parent == b"" for m in parts.values())


def test_without_a_layout_nothing_is_tagged_and_a_bad_layout_is_refused() -> None:
    storage = MemoryStorage()
    store("qwen3_next", storage, None)
    assert any(storage.blobs.values()) and not any(storage.meta.values())
    with pytest.raises(LayoutError):
        store("llama", MemoryStorage(), [{"tokens": [3, 1]}])


def test_warm_tokens_give_kv_blocks_their_ids_without_a_layout_and_snapshot_parts_none() -> None:
    storage = MemoryStorage()
    model = tiny_model("qwen3_next")
    tier = MlxTier(model, storage, block_size=BLOCK, snapshot_every=1, retention=Retention(warm_tokens=True))
    prepared = tier.prepare(prompt(40))
    generated = run(model, prepared.remaining.tolist(), prepared.cache, new=30).tokens
    tier.store(prepared, generated)
    tokens = prepared.tokens + generated
    keys = tier.kv_keys(tokens, 4)
    meta = storage.meta[("kv_cold", tier.namespace.digest)]
    assert [meta[k].tokens for k in keys] == [tuple(tokens[i * BLOCK : (i + 1) * BLOCK]) for i in range(4)]
    assert [meta[k].parent for k in keys] == [b"", *keys[:3]] and not any(m.tagged for m in meta.values())
    assert all(m.tokens == () for m in storage.meta[("ssm_cold", tier.namespace.digest)].values())


def test_a_real_vault_counts_the_tagged_blocks_by_class(vault_factory: VaultFactory) -> None:
    kv, ssm = vault_factory("kv", role="kv_cold"), vault_factory("ssm", role="ssm_cold")
    with Cluster({"kv_cold": [kv.address], "ssm_cold": [ssm.address]}, timeout=2.0) as cluster:
        store("llama", cluster, LAYOUT)
    with VaultClient(kv.address) as client:
        classes = {c.source: c.keys for c in client.stats().classes}
    assert classes == {"axioms": 2, "tools": 1, GENERATION: 1}
