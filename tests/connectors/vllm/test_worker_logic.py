"""The connector's worker half against real vault processes and real torch caches, without vLLM."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.conftest import VaultFactory
from tierkv.client.cluster import Cluster
from tierkv.connectors.vllm import worker as worker_module
from tierkv.connectors.vllm.layout import AttentionGeometry, KVGroupView, StateGroupView, attention_view
from tierkv.connectors.vllm.plan import (
    KV,
    STATE,
    BlockRef,
    GroupPlan,
    LoadJob,
    StepJobs,
    StoreJob,
    make_topology,
)
from tierkv.connectors.vllm.worker import GroupView, WorkerSide

BS, H, D, NUM_BLOCKS = 16, 2, 8, 12
KEYS = [hashlib.sha256(f"block-{i}".encode()).digest() for i in range(8)]


def kv_caches(layers: int = 2, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(layers)
    return [torch.randn((NUM_BLOCKS, H, BS, 2 * D), generator=gen).to(dtype) for _ in range(layers)]


def kv_view(caches: list[torch.Tensor]) -> KVGroupView:
    geom = AttentionGeometry(num_blocks=NUM_BLOCKS, num_kv_heads=H, block_size=BS, head_size=D)
    return KVGroupView([attention_view(f"l{i}", t, geom) for i, t in enumerate(caches)])


def make_worker(
    address: str,
    views: dict[int, list[GroupView]],
    *,
    timeout: float = 2.0,
    cluster: type[Cluster] = Cluster,
    **options: object,
) -> WorkerSide:
    groups = [
        GroupPlan(g, KV, BS, ("x",)) if isinstance(v[0], KVGroupView) else GroupPlan(g, STATE, BS, ("s",))
        for g, v in views.items()
    ]
    topo = make_topology(groups, [], BS)
    stream_views = {s: views[s.group][s.index] for s in topo.streams}
    namespaces = {s: hashlib.sha256(s.tag.encode()).digest() for s in topo.streams}
    return WorkerSide(
        topo,
        stream_views,
        namespaces,
        lambda: cluster({"kv_cold": address}, timeout=timeout),
        **options,  # type: ignore[arg-type]
    )


def wait(
    worker: WorkerSide, finished: set[str], *, sending: int = 0, recving: int = 0
) -> tuple[set[str], ...]:
    """Poll ``finished`` until the expected numbers of requests are done (each call drains)."""
    got: list[set[str]] = [set(), set(), set()]
    deadline = time.monotonic() + 20
    while len(got[0]) < sending or len(got[1]) < recving:
        assert time.monotonic() < deadline, f"transfers not done: {got}"
        for i, new in enumerate(worker.finished(finished)):
            got[i] |= new
        time.sleep(0.005)
    return tuple(got)


def refs(group: int, positions: list[int], block_ids: list[int]) -> tuple[BlockRef, ...]:
    return tuple(BlockRef(group, p, b, KEYS[p]) for p, b in zip(positions, block_ids, strict=True))


def store(worker: WorkerSide, request_id: str, blocks: tuple[BlockRef, ...]) -> None:
    """Submit one store and wait until the worker reports it sent."""
    worker.submit(StepJobs(stores=[StoreJob(request_id, blocks)]))
    wait(worker, {request_id}, sending=1)


def load(worker: WorkerSide, request_id: str, blocks: tuple[BlockRef, ...]) -> tuple[set[str], set[str]]:
    """Submit one asynchronous load and wait until it is reported: (received, failed)."""
    worker.submit(StepJobs(loads=[LoadJob(request_id, blocks)]))
    _, recving, failed = wait(worker, set(), recving=1)
    return recving, failed


@pytest.fixture
def vault_address(vault_factory: VaultFactory) -> str:
    return vault_factory().address


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A TCP port that accepts connections and never answers: every RPC runs into its deadline."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_store_then_load_restores_identical_blocks(vault_address: str) -> None:
    caches = kv_caches()
    worker = make_worker(vault_address, {0: [kv_view(caches)]})
    try:
        worker.submit(StepJobs(stores=[StoreJob("a", refs(0, [0, 1, 2], [3, 4, 5]))]))
        assert worker.finished(set()) == (set(), set(), set()), (
            "a store is reported only once vLLM finished it"
        )
        sending, _, _ = wait(worker, {"a"}, sending=1)
        assert sending == {"a"}
        assert worker.counters.totals()["stored_blocks"] == 3

        recving, failed = load(worker, "b", refs(0, [0, 1, 2], [9, 10, 11]))
        assert recving == {"b"} and failed == set()
        assert worker.take_load_errors() == set()
        for cache in caches:
            assert torch.equal(cache[9:12], cache[3:6])
    finally:
        worker.shutdown()


def test_idle_step_waits_until_a_transfer_ends(vault_address: str) -> None:
    worker = make_worker(vault_address, {0: [kv_view(kv_caches())]})
    try:
        worker.wait_for_progress(30.0)  # nothing in flight: returns at once
        worker.submit(StepJobs(stores=[StoreJob("a", refs(0, [0, 1], [1, 2]))]))
        worker.wait_for_progress(30.0)
        assert worker.finished({"a"})[0] == {"a"}, "the wait ends when the store is done"
        worker.submit(StepJobs(loads=[LoadJob("b", refs(0, [0, 1], [5, 6]))]))
        worker.wait_for_progress(30.0)
        assert worker.finished(set())[1] == {"b"}
    finally:
        worker.shutdown()


def test_sync_loads_finish_inside_submit_and_report_only_errors(vault_address: str) -> None:
    caches = kv_caches()
    worker = make_worker(vault_address, {0: [kv_view(caches)]})
    try:
        store(worker, "a", refs(0, [0, 1], [1, 2]))
        worker.submit(StepJobs(loads=[LoadJob("b", refs(0, [0, 1, 2], [8, 9, 10]), sync=True)]))
        for cache in caches:
            assert torch.equal(cache[8:10], cache[1:3]), "a sync load is done when submit returns"
        assert worker.take_load_errors() == {10}
        assert worker.finished(set()) == (set(), set(), set()), "vLLM does not wait for sync loads"
    finally:
        worker.shutdown()


class CountingCluster(Cluster):
    """A real cluster client that counts the gets it sends."""

    gets = 0

    def get_each(self, *args: Any, **kwargs: Any) -> Any:
        CountingCluster.gets += 1
        return super().get_each(*args, **kwargs)

    def get_buffers(self, *args: Any, **kwargs: Any) -> Any:
        CountingCluster.gets += 1
        return super().get_buffers(*args, **kwargs)


@pytest.mark.parametrize(("codec", "gets"), [("raw", 1), ("int8", 3)])
def test_long_requests_move_in_chunks_unless_received_into_the_cache(
    vault_address: str, monkeypatch: pytest.MonkeyPatch, codec: str, gets: int
) -> None:
    """Stores and decoded loads go ``CHUNK_BLOCKS`` at a time (bounded memory); a raw load received
    straight into the cache holds no buffer, so it is one get."""
    monkeypatch.setattr(worker_module, "CHUNK_BLOCKS", 2)
    monkeypatch.setattr(CountingCluster, "gets", 0)
    caches = kv_caches()
    worker = make_worker(vault_address, {0: [kv_view(caches)]}, codec=codec, cluster=CountingCluster)
    try:
        store(worker, "a", refs(0, [0, 1, 2, 3, 4], [1, 2, 3, 4, 5]))
        assert worker.counters.totals()["stored_blocks"] == 5
        before = CountingCluster.gets
        load(worker, "b", refs(0, [0, 1, 2, 3, 4], [7, 8, 9, 10, 11]))
        assert CountingCluster.gets - before == gets
        assert worker.take_load_errors() == set()
        for cache in caches:
            if codec == "raw":
                assert torch.equal(cache[7:12], cache[1:6])
            else:
                torch.testing.assert_close(cache[7:12], cache[1:6], atol=0.05, rtol=0.02)
    finally:
        worker.shutdown()


def test_stores_skip_blocks_the_vault_already_holds(vault_address: str) -> None:
    worker = make_worker(vault_address, {0: [kv_view(kv_caches())]})
    try:
        store(worker, "a", refs(0, [0, 1], [1, 2]))
        store(worker, "b", refs(0, [0, 1, 2], [1, 2, 3]))
        totals = worker.counters.totals()
        assert totals["stored_blocks"] == 3
        assert totals["store_skipped_blocks"] == 2
    finally:
        worker.shutdown()


def test_int8_codec_round_trips_within_quantization_error(vault_address: str) -> None:
    caches = kv_caches(dtype=torch.bfloat16)
    worker = make_worker(vault_address, {0: [kv_view(caches)]}, codec="int8")
    try:
        store(worker, "a", refs(0, [0], [2]))
        load(worker, "b", refs(0, [0], [7]))
        for cache in caches:
            assert cache[7].dtype == torch.bfloat16
            assert not torch.equal(cache[7], cache[2])
            torch.testing.assert_close(cache[7].float(), cache[2].float(), atol=0.05, rtol=0.02)
    finally:
        worker.shutdown()


def test_corrupt_and_missing_blocks_are_reported_and_never_used(vault_address: str) -> None:
    """A block that does not arrive is not touched; a corrupt one was received straight into its rows
    (that memory belongs to the load until it reports) and is reported, so vLLM recomputes it."""
    caches = kv_caches()
    worker = make_worker(vault_address, {0: [kv_view(caches)]})
    try:
        store(worker, "a", refs(0, [0, 1], [1, 2]))
        ns = worker.namespaces[worker.topology.streams[0]]
        with Cluster({"kv_cold": vault_address}) as cluster:
            (blob,) = cluster.get(ns, [KEYS[1]])
            assert blob is not None
            bad = bytearray(blob)
            bad[len(bad) // 2] ^= 0x01
            cluster.put(ns, {KEYS[1]: bytes(bad)})

        before = [c[9:12].clone() for c in caches]
        recving, failed = load(worker, "b", refs(0, [0, 1, 2], [9, 10, 11]))
        assert recving == {"b"} and failed == set()
        assert worker.take_load_errors() == {10, 11}, "block 1 is corrupt, block 2 was never stored"
        for cache, old in zip(caches, before, strict=True):
            assert torch.equal(cache[9], cache[1])
            assert torch.equal(cache[11], old[2]), "a block that never arrived is not written"
        totals = worker.counters.totals()
        assert totals["load_errors"] == 2 and totals["load_landed_blocks"] == 2
        with Cluster({"kv_cold": vault_address}) as cluster:
            assert cluster.get(ns, [KEYS[1]]) == [None], "a blob that fails verification is deleted"
    finally:
        worker.shutdown()


def test_several_groups_fail_whole_requests(vault_address: str) -> None:
    conv = [torch.randn(NUM_BLOCKS, 3, 4)]
    ssm = [torch.randn(NUM_BLOCKS, 2, 4, 4)]
    views: dict[int, list[GroupView]] = {
        0: [kv_view(kv_caches())],
        1: [StateGroupView(["m"], [[conv[0], ssm[0]]])],
    }
    worker = make_worker(vault_address, views)
    try:
        assert not worker.per_block_errors
        worker.submit(StepJobs(stores=[StoreJob("a", refs(0, [0, 1], [1, 2]))]))
        worker.submit(StepJobs(stores=[StoreJob("snap", refs(1, [1], [5]), snapshot=True)]))
        snapshot = conv[0][5].clone()
        conv[0][5] += 100.0  # vLLM may reuse the block right after the step: the copy was taken before
        wait(worker, {"a"}, sending=1)
        deadline = time.monotonic() + 20
        while worker.counters.totals()["stored_blocks"] < 3:  # 2 KV blocks and 1 state page
            assert time.monotonic() < deadline
            time.sleep(0.005)

        recving, failed = load(worker, "ok", refs(0, [0, 1], [8, 9]) + refs(1, [1], [10]))
        assert recving == {"ok"} and failed == set()
        assert torch.equal(conv[0][10], snapshot)
        assert torch.equal(ssm[0][10], ssm[0][5])

        recving, failed = load(worker, "bad", refs(0, [0, 1], [8, 9]) + refs(1, [0], [11]))
        assert recving == failed == {"bad"}
        assert worker.take_load_errors() == set()
    finally:
        worker.shutdown()


def test_dead_vault_fails_loads_and_releases_stores(vault_factory: VaultFactory) -> None:
    vault = vault_factory()
    address = vault.address
    vault.kill()
    worker = make_worker(address, {0: [kv_view(kv_caches())]}, timeout=0.5)
    try:
        worker.submit(StepJobs(stores=[StoreJob("a", refs(0, [0], [1]))]))
        worker.submit(StepJobs(loads=[LoadJob("b", refs(0, [0, 1], [4, 5]))]))
        sending, recving, _ = wait(worker, {"a"}, sending=1, recving=1)
        assert sending == {"a"} and recving == {"b"}
        assert worker.take_load_errors() == {4, 5}
        assert worker.counters.totals()["stored_blocks"] == 0
    finally:
        worker.shutdown()


def test_full_store_queue_drops_instead_of_blocking(blackhole: str) -> None:
    worker = make_worker(
        blackhole, {0: [kv_view(kv_caches())]}, timeout=1.0, max_inflight_stores=1, max_queued_stores=0
    )
    try:
        worker.submit(StepJobs(stores=[StoreJob("slow", refs(0, [0], [1]))]))
        worker.submit(StepJobs(stores=[StoreJob("dropped", refs(0, [0], [2]))]))
        assert worker.counters.totals()["stores_dropped"] == 1
        sending, _, _ = worker.finished({"slow", "dropped"})
        assert sending == {"dropped"}, "the dropped store is released at once, the slow one still runs"
        sending, _, _ = wait(worker, {"slow"}, sending=1)
        assert sending == {"slow"}
    finally:
        worker.shutdown()


def test_full_store_queue_drops_snapshots_without_reporting_them(blackhole: str) -> None:
    views: dict[int, list[GroupView]] = {
        0: [kv_view(kv_caches())],
        1: [StateGroupView(["m"], [[torch.randn(NUM_BLOCKS, 3, 4), torch.randn(NUM_BLOCKS, 2, 4, 4)]])],
    }
    worker = make_worker(blackhole, views, timeout=1.0, max_inflight_stores=1, max_queued_stores=0)
    try:
        worker.submit(StepJobs(stores=[StoreJob("slow", refs(0, [0], [1]))]))
        worker.submit(StepJobs(stores=[StoreJob("snap", refs(1, [1], [5]), snapshot=True)]))
        totals = worker.counters.totals()
        assert totals["snapshot_blocks"] == 1 and totals["stores_dropped"] == 1
        sending, _, _ = wait(worker, {"slow", "snap"}, sending=1)
        assert sending == {"slow"}, "a snapshot holds no vLLM blocks, so it is never reported"
    finally:
        worker.shutdown()
