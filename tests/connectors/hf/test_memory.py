"""TieredSession over the in-memory storage: what the hook asks of the pipeline, call by call."""

from __future__ import annotations

import pytest
import torch

from tests.connectors.hf.models import prompt, reference, tiny_model
from tierkv.config import ContextWeights
from tierkv.connectors.hf import TieredSession
from tierkv.connectors.hf.hot import as_tokens
from tierkv.tiering import MemoryStorage

NEW = 8


@pytest.mark.parametrize(("family", "gets"), [("qwen2", 1), ("qwen3_next", 2)])
def test_a_cold_restore_is_one_lookup_and_one_get_per_role(family: str, gets: int) -> None:
    model = tiny_model(family)
    storage = MemoryStorage()
    ids = prompt(50)
    ref = reference(model, ids, NEW)
    writer = TieredSession(model, storage, block_size=16, state_stride_blocks=1)
    writer.generate(ids, max_new_tokens=NEW)
    assert writer.persist(timeout=30) and writer.stored_blobs > 0
    assert writer.stored_bytes == sum(len(b) for space in storage.blobs.values() for b in space.values())

    storage.calls.clear()
    reader = TieredSession(model, storage, block_size=16, state_stride_blocks=1)
    assert torch.equal(reader.generate(ids, max_new_tokens=NEW), ref)
    assert reader.last_stats.source == "cold" and reader.last_stats.restored_tokens == 48
    assert dict(storage.calls) == {"lookup": 1, "get": gets}, "KV in one get, the state snapshot in one"


def test_a_corrupt_block_is_deleted_and_counted() -> None:
    model = tiny_model("llama")
    storage = MemoryStorage()
    ids = prompt(50)
    writer = TieredSession(model, storage, block_size=16)
    writer.generate(ids, max_new_tokens=NEW)
    assert writer.persist(timeout=30)
    key = writer.streams.kv_keys(as_tokens(ids[0].numpy()), 3)[2]
    space = storage.blobs[("kv_cold", writer.namespace)]
    space[key] = space[key][:-1] + bytes([space[key][-1] ^ 1])

    reader = TieredSession(model, storage, block_size=16)
    assert torch.equal(reader.generate(ids, max_new_tokens=NEW), reference(model, ids, NEW))
    stats = reader.last_stats
    assert stats.rejected_blobs == 1 and stats.restored_tokens == 32 and stats.cold_blocks == 2
    assert key not in space and storage.calls["delete"] == 1


def test_the_hot_tier_scores_with_the_weights_given() -> None:
    weights = ContextWeights(importance=1.0, hits=2.0)
    session = TieredSession(tiny_model("llama"), MemoryStorage(), block_size=16, weights=weights)
    assert session.hot.weights == weights
    assert TieredSession(tiny_model("llama"), None, block_size=16).hot.weights == ContextWeights()
