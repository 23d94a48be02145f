"""Retention metadata through the store path: each put carries its own blocks' metadata, per key."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from tierkv.codec import LayerGroup
from tierkv.records import PutResult
from tierkv.retention import BlockMeta, Retention, block_meta
from tierkv.roles import Role
from tierkv.tiering import ColdTier, LazyStorage, MemoryStorage, NumpyArrays, StreamSpec

NS = hashlib.sha256(b"meta").digest()
KV = StreamSpec(NS, LayerGroup.ATTENTION)
SSM = StreamSpec(NS, LayerGroup.SSM)
BS = 16
LAYOUT = [
    {"tokens": [0, 20], "source": "axioms"},  # block 1 (16..32) straddles axioms and tools
    {"tokens": [20, 70], "source": "tools", "durability": "ephemeral"},
]


def keys(n: int) -> list[bytes]:
    return [hashlib.sha256(b"k" + bytes([i])).digest() for i in range(n)]


def arrays(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, 4, 8)).astype(np.float32) for _ in range(n)]


class Recording(MemoryStorage):
    """Keeps the keyword arguments of every put, to see what each batch carried."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[tuple[list[bytes], dict[str, object]]] = []

    def put(
        self, namespace: bytes, items: Mapping[bytes, bytes], role: str = Role.KV_COLD, **kw: object
    ) -> PutResult:
        self.puts.append((list(items), dict(kw)))
        return super().put(namespace, items, role, **kw)  # type: ignore[arg-type]


def test_metadata_reaches_storage_per_key_and_each_batch_carries_only_its_own() -> None:
    storage = Recording()
    one = len(NumpyArrays().encode(arrays(1)[0], "raw", BS, LayerGroup.ATTENTION))
    tier = ColdTier(storage, NumpyArrays(), max_put_bytes=2 * one)
    ks = keys(5)
    meta = block_meta(ks, LAYOUT, BS)
    tally = tier.store(KV, ((k, a, BS) for k, a in zip(ks, arrays(5), strict=True)), meta=meta)
    assert tally.stored == 5 and len(storage.puts) == 3
    for batch, kw in storage.puts:
        assert set(kw["meta"]) == set(batch), "a put carries exactly its own blocks' metadata"  # type: ignore[arg-type]
    assert storage.meta[("kv_cold", NS)] == meta

    got = storage.meta[("kv_cold", NS)]
    axioms, tools = Retention().meta("axioms"), Retention().meta("tools")
    assert [got[k].source for k in ks] == ["axioms", "axioms", "tools", "tools", "tools"]
    assert (got[ks[1]].protected, got[ks[1]].ttl_s) == (True, axioms.ttl_s), "straddling: more protective"
    assert got[ks[2]].ttl_s == 15 * 60 and got[ks[2]].importance == tools.importance
    assert [got[k].parent for k in ks] == [b"", *ks[:-1]], "parents follow the chain"


def test_blocks_without_an_entry_are_stored_untagged_and_a_store_without_meta_is_the_old_call() -> None:
    storage = Recording()
    tier = ColdTier(storage, NumpyArrays())
    ks = keys(3)
    tier.store(KV, ((k, a, BS) for k, a in zip(ks, arrays(3), strict=True)), meta={ks[0]: BlockMeta("rules")})
    assert storage.meta[("kv_cold", NS)] == {ks[0]: BlockMeta("rules")}
    tier.store(SSM, ((k, a, BS) for k, a in zip(ks, arrays(3), strict=True)))
    tier.store(SSM, ((k, a, BS) for k, a in zip(ks, arrays(3), strict=True)), meta={})
    assert [kw for _, kw in storage.puts[1:]] == [{}, {}], "no metadata: put is called exactly as before"
    assert not storage.meta[("ssm_cold", NS)]


def test_memory_storage_forgets_metadata_on_an_untagged_put_and_on_delete() -> None:
    storage = MemoryStorage()
    lazy = LazyStorage(lambda: storage)
    ks = keys(2)
    lazy.put(NS, {k: b"x" for k in ks}, meta={k: BlockMeta("tools") for k in ks})
    assert set(storage.meta[("kv_cold", NS)]) == set(ks), "the lazy storage passes metadata on"
    storage.put(NS, {ks[0]: b"y"})
    storage.delete(NS, [ks[1]])
    assert not storage.meta[("kv_cold", NS)]
