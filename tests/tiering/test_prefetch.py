"""Predictive prefetch through the pipeline, against real vault processes on loopback (real LMDB).

A chain restored after its predecessor comes from the prefetch buffer (counted, no BatchGet for it); a
blob that does not verify on arrival is never buffered (the restore's decode is the check after that); a hung
vault makes prefetch give up while restores from another vault go on (ordering and counters, no timing
thresholds)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from tests.conftest import VaultFactory
from tests.processes import stopped
from tierkv.client.cluster import Cluster
from tierkv.codec import LayerGroup
from tierkv.retention import BlockMeta
from tierkv.tiering import ColdTier, LazyStorage, NumpyArrays, Restored, StreamSpec
from tierkv.vault.launcher import VaultProcess

NS = hashlib.sha256(b"prefetch").digest()
KV = StreamSpec(NS, LayerGroup.ATTENTION)
SSM = StreamSpec(NS, LayerGroup.SSM)
SHAPE = (2, 2, 4, 8)
TOKENS = 4


def key(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


def arrays(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(n)]


def store_chain(
    tier: ColdTier[np.ndarray], names: list[str], parent: str = "", spec: StreamSpec = KV
) -> list[bytes]:
    ks = [key(n) for n in names]
    parents = [key(parent) if parent else b"", *ks[:-1]]
    meta = {k: BlockMeta(parent=p) for k, p in zip(ks, parents, strict=True)}
    tally = tier.store(
        spec, ((k, a, TOKENS) for k, a in zip(ks, arrays(len(ks), len(names[0])), strict=True)), meta
    )
    assert tally.stored == len(ks)
    return ks


def restore(tier: ColdTier[np.ndarray], ks: list[bytes], spec: StreamSpec = KV) -> Restored:
    out = [np.empty(SHAPE, np.float32) for _ in ks]
    return tier.restore(spec, ks, spec.expect(SHAPE, TOKENS), out.__getitem__)


def vault_hits(cluster: Cluster) -> int:
    return sum(st.hits for _, _, st in cluster.stats() if not isinstance(st, Exception))


@pytest.fixture
def vault(vault_factory: VaultFactory) -> VaultProcess:
    return vault_factory()


@pytest.fixture
def tier(vault: VaultProcess) -> Iterator[ColdTier[np.ndarray]]:
    with Cluster({"kv_cold": [vault.address]}, timeout=10.0) as cluster:
        t = ColdTier(cluster, NumpyArrays(), prefetch_bytes=1 << 20, prefetch_timeout_s=5.0)
        yield t
        t.close()


def test_a_chain_fetched_after_its_predecessor_comes_from_the_buffer(tier: ColdTier[np.ndarray]) -> None:
    assert tier.prefetch is not None
    first = store_chain(tier, ["sys-0", "sys-1"])
    turn = store_chain(tier, ["turn-0", "turn-1", "turn-2"], parent="sys-1")
    got = restore(tier, first)
    assert got.decoded == [0, 1] and got.prefetched == 0
    assert tier.prefetch.drain(10.0)
    assert tier.prefetch.stats.fetched == 3
    cluster = tier.storage
    assert isinstance(cluster, Cluster)
    hits_before = vault_hits(cluster)
    assert tier.lookup(KV, first + turn) == 5
    got = restore(tier, first + turn)
    assert got.decoded == [0, 1, 2, 3, 4] and got.prefetched == 3
    assert vault_hits(cluster) == hits_before + 2  # only the first chain went to the vault
    s = tier.prefetch.stats
    assert (s.hits, s.hit_bytes, s.rejected, s.wasted) == (3, s.fetched_bytes, 0, 0)
    # the same data as a restore without prefetch
    plain = ColdTier(cluster, NumpyArrays())
    a = [np.empty(SHAPE, np.float32) for _ in turn]
    b = [np.empty(SHAPE, np.float32) for _ in turn]
    plain.restore(KV, turn, KV.expect(SHAPE, TOKENS), a.__getitem__)
    tier.restore(KV, turn, KV.expect(SHAPE, TOKENS), b.__getitem__)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_full_buffer_drops_the_oldest_unused_blocks_as_waste(vault: VaultProcess) -> None:
    with Cluster({"kv_cold": [vault.address]}, timeout=10.0) as cluster:
        one = len(NumpyArrays().encode(arrays(1, 0)[0], "raw", TOKENS, LayerGroup.ATTENTION))
        tier = ColdTier(cluster, NumpyArrays(), prefetch_bytes=2 * one, prefetch_timeout_s=5.0)
        assert tier.prefetch is not None
        a, x = store_chain(tier, ["a"]), store_chain(tier, ["x"])
        store_chain(tier, ["b-0", "b-1", "b-2", "b-3"], parent="a")
        store_chain(tier, ["c-0", "c-1"], parent="x")
        restore(tier, a)
        assert tier.prefetch.drain(10.0)
        s = tier.prefetch.stats
        assert (s.suggested, s.fetched, s.wasted) == (2, 2, 0)  # the hint is bounded by the buffer too
        restore(tier, x)
        assert tier.prefetch.drain(10.0)
        assert (s.fetched, s.wasted, s.wasted_bytes) == (4, 2, 2 * one)  # b-0, b-1 made room, unused
        assert tier.prefetch.buffered_bytes == 2 * one
        assert tier.lookup(KV, [*x, key("c-0"), key("c-1")]) == 3
        cluster.delete(NS, [key("c-0"), key("c-1")])
        assert tier.lookup(KV, [key("c-0"), key("c-1")]) == 2  # the buffer counts, not only the vault
        tier.close()
        assert (s.wasted, s.hits) == (4, 0)


def test_prefetch_never_hands_out_a_blob_that_does_not_verify(tier: ColdTier[np.ndarray]) -> None:
    assert tier.prefetch is not None
    cluster = tier.storage
    assert isinstance(cluster, Cluster)
    first = store_chain(tier, ["p-0"])
    nxt = store_chain(tier, ["n-0", "n-1"], parent="p-0")
    # on the vault: n-1 replaced by bytes that are no blob (the vault's own checksum is fine)
    cluster.put(NS, {nxt[1]: b"\x00" * 64}, meta={nxt[1]: BlockMeta(parent=nxt[0])})
    restore(tier, first)
    assert tier.prefetch.drain(10.0)
    assert tier.prefetch.stats.rejected == 1 and tier.prefetch.stats.fetched == 1
    assert tier.lookup(KV, nxt) == 2  # n-1 is not in the buffer: the vault reports it
    got = restore(tier, nxt)
    assert got.prefetched == 1 and tier.prefetch.stats.hits == 1
    assert got.decoded == [0]  # n-0 from the buffer; n-1 from the vault, rejected as without prefetch
    assert got.rejected == 1


def test_a_hung_vault_makes_prefetch_give_up_without_holding_up_restores(
    vault_factory: VaultFactory,
) -> None:
    kv, ssm = vault_factory("kv"), vault_factory("ssm")
    with Cluster({"kv_cold": [kv.address], "ssm_cold": [ssm.address]}, timeout=30.0) as cluster:
        tier = ColdTier(cluster, NumpyArrays(), prefetch_bytes=1 << 20, prefetch_timeout_s=2.0)
        assert tier.prefetch is not None
        first = store_chain(tier, ["h-0"])
        store_chain(tier, ["h-1"], parent="h-0")
        state = store_chain(tier, ["s-0"], spec=SSM)
        order: list[str] = []
        with stopped(kv):
            prefetch = tier.prefetch
            prefetch.request(NS, "kv_cold", first)

            def wait_for_prefetch() -> None:
                prefetch.drain(30.0)
                order.append("prefetch gave up")

            waiter = threading.Thread(target=wait_for_prefetch)
            waiter.start()
            got = restore(tier, state, spec=SSM)  # another vault: answered while the prefetch hangs
            order.append("restore done")
            assert got.decoded == [0] and tier.prefetch.stats.gave_up == 0
            waiter.join(30.0)
        assert order == ["restore done", "prefetch gave up"]
        s = tier.prefetch.stats
        assert (s.jobs, s.gave_up, s.fetched, s.hits) == (2, 1, 0, 0)  # the second: after the state restore
        assert restore(tier, first).decoded == [0]  # the vault answers again
        tier.close()


def test_prefetch_is_off_unless_asked_for(tier: ColdTier[np.ndarray]) -> None:
    plain = ColdTier(tier.storage, NumpyArrays())
    assert plain.prefetch is None
    first = store_chain(plain, ["o-0"])
    store_chain(plain, ["o-1"], parent="o-0")
    assert restore(plain, first).prefetched == 0


def test_prefetch_reaches_the_vaults_behind_a_lazy_storage(vault: VaultProcess) -> None:
    """vLLM workers open their storage lazily (after fork): prefetch asks the storage it wraps."""
    with Cluster({"kv_cold": [vault.address]}, timeout=10.0) as cluster:
        tier = ColdTier(LazyStorage(lambda: cluster), NumpyArrays(), prefetch_bytes=1 << 20)
        assert tier.prefetch is not None
        first = store_chain(tier, ["l-0"])
        nxt = store_chain(tier, ["l-1"], parent="l-0")
        restore(tier, first)
        assert tier.prefetch.drain(10.0) and tier.prefetch.stats.fetched == 1
        assert restore(tier, nxt).prefetched == 1
        tier.close()
