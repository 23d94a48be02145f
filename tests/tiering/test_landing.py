"""Restores received straight into a hook's rows (``rows=``), through real vault processes."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from tests.conftest import VaultFactory
from tierkv.client.cluster import Cluster
from tierkv.codec import LayerGroup
from tierkv.codec.torch_codec import encode_tensor
from tierkv.tiering import ColdTier, StreamSpec
from tierkv.tiering.target import Target
from tierkv.tiering.tensors import TorchArrays

NS = hashlib.sha256(b"landing").digest()
SPEC = StreamSpec(NS, LayerGroup.ATTENTION)
SHAPE = (3, 2, 16, 32)  # layers, heads, tokens, width: each layer one row of the cache
TOKENS = 16


def keys(n: int) -> list[bytes]:
    return [hashlib.sha256(b"block" + bytes([i])).digest() for i in range(n)]


class Cache:
    """A paged cache of float32 blocks whose layers are byte rows, as vLLM's CPU cache is."""

    def __init__(self, blocks: int) -> None:
        self.values = torch.zeros((blocks, *SHAPE))
        self.bytes = self.values.view(torch.uint8).numpy().reshape(blocks, SHAPE[0], -1)
        self.placed: list[int] = []

    def rows(self, slot: int) -> list[memoryview]:
        return [memoryview(self.bytes[slot, layer]) for layer in range(SHAPE[0])]

    def place(self, slot: int, values: torch.Tensor) -> None:
        self.values[slot].copy_(values)
        self.placed.append(slot)


def restore(tier: ColdTier[torch.Tensor], ks: list[bytes], cache: Cache, slots: list[int]):  # type: ignore[no-untyped-def]
    return tier.restore(
        SPEC,
        ks,
        SPEC.expect(SHAPE, TOKENS, "float32"),
        place=lambda i, v: cache.place(slots[i], v),
        rows=lambda i: cache.rows(slots[i]),
    )


def test_blobs_land_in_the_rows_exactly_and_nothing_is_copied(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    data = [torch.randn(SHAPE) for _ in range(6)]
    with Cluster({"kv_cold": [v.address]}, timeout=5.0) as cluster:
        tier = ColdTier(cluster, TorchArrays())
        tier.store(SPEC, [(k, d, TOKENS) for k, d in zip(keys(6), data, strict=True)])
        cache = Cache(10)
        slots = [9, 0, 4, 2, 7, 5]
        got = restore(tier, keys(6), cache, slots)
    assert got.decoded == list(range(6)) and got.landed == 6
    assert cache.placed == [] and got.place_s == 0, "landed blobs are not placed (copied) again"
    for i, slot in enumerate(slots):
        assert torch.equal(cache.values[slot], data[i])
    assert all(torch.count_nonzero(cache.values[s]) == 0 for s in (1, 3, 6, 8)), "other blocks untouched"


def test_a_landed_blob_that_does_not_verify_is_rejected_and_deleted(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    blobs = [bytearray(encode_tensor(torch.randn(SHAPE), codec="raw", tokens=TOKENS)) for _ in range(3)]
    blobs[1][-5] ^= 0x40  # a payload bit: only the checksum over the rows can tell
    with Cluster({"kv_cold": [v.address]}, timeout=5.0) as cluster:
        assert cluster.put(NS, dict(zip(keys(3), map(bytes, blobs), strict=True))).stored == 3
        tier = ColdTier(cluster, TorchArrays())
        cache = Cache(3)
        got = restore(tier, keys(3), cache, [0, 1, 2])
        assert got.landed == 3 and got.decoded == [0, 2] and got.rejected == 1 and got.failed == [1]
        assert cluster.get_buffers(NS, [keys(3)[1]]) == [None], "the corrupt blob was deleted"


def test_replicated_keys_are_placed_not_landed(vault_factory: VaultFactory) -> None:
    """Two owners may both send a key: only a key one vault can send is received into the rows."""
    vaults = [vault_factory(f"v{i}") for i in range(2)]
    data = [torch.randn(SHAPE) for _ in range(4)]
    with Cluster({"kv_cold": [v.address for v in vaults]}, replication=2, timeout=5.0) as cluster:
        tier = ColdTier(cluster, TorchArrays())
        tier.store(SPEC, [(k, d, TOKENS) for k, d in zip(keys(4), data, strict=True)])
        cache = Cache(4)
        got = restore(tier, keys(4), cache, [0, 1, 2, 3])
    assert got.decoded == [0, 1, 2, 3] and got.landed == 0 and sorted(cache.placed) == [0, 1, 2, 3]
    for i in range(4):
        assert torch.equal(cache.values[i], data[i])


def test_rows_that_do_not_hold_the_expected_blob_are_not_landed_into() -> None:
    """A size mismatch, rows refused by the hook, or an expectation without a dtype: the blob is
    placed as before (the rows could hold values of another size or dtype)."""
    cache = Cache(2)
    expect = SPEC.expect(SHAPE, TOKENS, "float32")
    blob_len = 56 + 8 * len(SHAPE) + int(np.prod(SHAPE)) * 4
    target = Target(TorchArrays(), expect, None, cache.place, cache.rows)
    assert target.land(0, blob_len) is not None
    assert target.land(0, blob_len - 4) is None
    assert Target(TorchArrays(), expect, None, cache.place, lambda i: None).land(0, blob_len) is None
    untyped = SPEC.expect(SHAPE, TOKENS)
    assert Target(TorchArrays(), untyped, None, cache.place, cache.rows).land(0, blob_len) is None
    with pytest.raises(ValueError, match="exactly one"):
        Target(TorchArrays(), expect, None, None, cache.rows)
