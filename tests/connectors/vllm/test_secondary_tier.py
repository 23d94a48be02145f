"""tierkv as a secondary tier of vLLM's offloading, driven through vLLM's real tiering classes.

vLLM's ``TieringOffloadingSpec`` builds its real ``TieringOffloadingManager``, CPU primary tier (a real
``/dev/shm`` region) and, through its real ``SecondaryTierFactory`` and ``module_path``, our tier; the
vaults are real processes on loopback. What cannot run here is vLLM's GPU↔CPU worker (vLLM refuses CPU
offloading on its CPU backend), so the test plays it: it writes chunk bytes into the primary slots vLLM
hands out for a store and reads them from the slots vLLM hands out for a load, as that worker would.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from tests.conftest import VaultFactory
from tests.processes import stopped
from tierkv.client.cluster import Cluster
from tierkv.connectors.vllm.secondary import TierKVSecondaryTier
from tierkv.errors import ConfigError
from tierkv.vault.launcher import VaultProcess

pytestmark = pytest.mark.vllm

CHUNK_BYTES = 2 * 2 * 16 * 2 * 64 * 2  # layers × K/V × tokens × heads × head dim × bf16: one page
PRIMARY_CHUNKS = 8
STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
TIER = {"type": "TierKVSecondaryTier", "module_path": "tierkv.connectors.vllm.secondary"}


def offloading_config(
    tier: dict[str, Any], dtype: str = "bfloat16", events: bool = False
) -> OffloadingConfig:
    parallel = OffloadingParallelConfig(
        rank=0,
        world_size=1,
        tp_size=1,
        pp_size=1,
        pcp_size=1,
        dcp_size=1,
        data_parallel_index=0,
        data_parallel_size=1,
        data_parallel_rank_local=None,
        is_parallelism_agnostic=True,
    )
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0", "l1"), group_id=0),),
        worker_kv_bytes_per_block=CHUNK_BYTES,
        enable_kv_cache_events=events,
        extra_config={
            "cpu_bytes_to_use": PRIMARY_CHUNKS * CHUNK_BYTES,
            "secondary_tiers": [{**TIER, **tier}],
        },
        engine_id=f"tierkv-test-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name="random/llama", dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=parallel,
    )


@dataclass
class Engine:
    """vLLM's tiering manager, with the test playing the GPU worker and the scheduler's step loop."""

    manager: TieringOffloadingManager
    requests: int = 0
    payloads: dict[OffloadKey, bytes] = field(default_factory=dict)

    @property
    def tier(self) -> TierKVSecondaryTier:
        tier = self.manager.secondary_tiers[0]
        assert isinstance(tier, TierKVSecondaryTier)
        return tier

    def rows(self) -> np.ndarray[Any, Any]:
        return np.frombuffer(self.manager.primary_tier.get_kv_memoryview(), np.uint8).reshape(-1, CHUNK_BYTES)

    def request(self) -> ReqContext:
        self.requests += 1
        ctx = ReqContext(req_id=f"req-{self.requests}")
        self.manager.on_new_request(ctx)
        return ctx

    def store(self, keys: Sequence[OffloadKey], seed: int = 0) -> None:
        """GPU → primary (the test writes the bytes), then vLLM cascades to our tier; waits for the jobs."""
        ctx = self.request()
        out = self.manager.prepare_store(keys, ctx)
        assert out is not None and list(out.keys_to_store) == list(keys)
        rng = np.random.default_rng(seed)
        for key, slot in zip(keys, out.store_spec.chunk_ids, strict=True):
            data = rng.integers(0, 256, CHUNK_BYTES, dtype=np.uint8)
            self.rows()[slot] = data
            self.payloads[key] = data.tobytes()
        self.manager.complete_store(keys, ctx)
        self.manager.on_request_finished(ctx)
        self.settle()

    def settle(self, timeout: float = 30.0) -> None:
        """Step the scheduler until no transfer job is in flight (bounded)."""
        deadline = time.monotonic() + timeout
        while self.manager.has_pending_work():
            assert time.monotonic() < deadline, "tier jobs did not finish"
            self.manager.on_schedule_end(STEP)
            time.sleep(0.01)

    def evict_primary(self) -> None:
        self.manager.reset_cache()
        # vLLM 0.33 holds promotions after a reset until the workers have reported every job in flight
        # at it (a late write to a freed primary slot); this test plays the worker and settled them all
        flushed = getattr(self.manager, "on_reset_flushed", None)  # absent in 0.32
        if flushed is not None:
            flushed()
        assert all(
            self.manager.primary_tier.lookup(k, ReqContext("probe")) is LookupResult.MISS
            for k in self.payloads
        )

    def lookup(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, timeout: float = 30.0
    ) -> list[LookupResult]:
        """Look every key up once per step, as the scheduler does, until none is pending (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            results = [self.manager.lookup(k, ctx) for k in keys]
            self.manager.on_schedule_end(STEP)
            if all(r in (LookupResult.HIT, LookupResult.MISS) for r in results):
                return results
            assert time.monotonic() < deadline, f"lookups still pending: {results}"
            time.sleep(0.01)

    def loaded(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> list[bytes]:
        """What the GPU worker would read for ``keys`` from the primary tier (all must be hits)."""
        spec = self.manager.prepare_load(keys, ctx)
        data = [self.rows()[slot].tobytes() for slot in spec.chunk_ids]
        self.manager.complete_load(keys, ctx)
        return data


def counter(stats: Any, name: str) -> float:
    """A counter of vLLM's offloading stats, summed over its labels (0 when never counted)."""
    return (
        float(sum(stats.data["data"].get(f"vllm:kv_offload_tiering_{name}", {}).values())) if stats else 0.0
    )


def keys_of(tag: int, n: int) -> list[OffloadKey]:
    return [make_offload_key(bytes([tag, i]) * 16, 0) for i in range(n)]


@pytest.fixture
def engine_factory() -> Iterator[Any]:
    made: list[TieringOffloadingManager] = []

    def make(events: bool = False, **tier: Any) -> Engine:
        tier.setdefault("timeout", 3.0)
        manager = TieringOffloadingSpec(offloading_config(tier, events=events)).get_manager()
        assert isinstance(manager, TieringOffloadingManager)
        made.append(manager)
        return Engine(manager)

    yield make
    for manager in made:
        manager.shutdown()


def vault_blobs(vault: VaultProcess, engine: Engine, keys: Sequence[OffloadKey]) -> list[Any]:
    with Cluster({"kv_cold": [vault.address]}, timeout=5.0) as cluster:
        return list(cluster.get_buffers(engine.tier.stream.namespace, engine.tier.vault_keys(keys)))


def test_store_evict_load_gives_identical_bytes(vault: VaultProcess, engine_factory: Any) -> None:
    engine = engine_factory(kv_cold=vault.address, events=True, enable_kv_events=True)
    keys = keys_of(1, 5)
    engine.store(keys)
    assert all(b is not None for b in vault_blobs(vault, engine, keys)), "the cascade reached the vault"
    stored_events = [
        e for e in engine.manager.take_events() if e.ownership is None and e.medium.value == "STORAGE"
    ]
    assert sorted(k for e in stored_events for k in e.keys) == sorted(keys)
    assert not any(e.removed for e in stored_events)
    stats = engine.manager.get_stats()
    assert counter(stats, "write_bytes") == len(keys) * CHUNK_BYTES

    engine.evict_primary()
    ctx = engine.request()
    assert engine.lookup(keys, ctx) == [LookupResult.HIT] * len(keys)
    assert engine.loaded(keys, ctx) == [engine.payloads[k] for k in keys]
    assert engine.tier.blocks_rejected == 0
    assert counter(engine.manager.get_stats(), "read_bytes") == len(keys) * CHUNK_BYTES

    region = engine.manager.primary_tier._mmap_region.mmap_obj
    engine.manager.shutdown()
    assert region.closed, "the tier let go of vLLM's memory, so vLLM could unmap it"


def test_unknown_chunks_miss(vault: VaultProcess, engine_factory: Any) -> None:
    engine = engine_factory(kv_cold=vault.address)
    engine.store(keys_of(1, 2))
    ctx = engine.request()
    assert engine.lookup(keys_of(2, 2), ctx) == [LookupResult.MISS] * 2


def test_corrupt_chunk_fails_the_load_and_is_deleted(vault: VaultProcess, engine_factory: Any) -> None:
    engine = engine_factory(kv_cold=vault.address)
    keys = keys_of(3, 3)
    engine.store(keys)
    with Cluster({"kv_cold": [vault.address]}, timeout=5.0) as cluster:
        ns, vkeys = engine.tier.stream.namespace, engine.tier.vault_keys(keys)
        blob = bytearray(cluster.get_buffers(ns, vkeys[1:2])[0])
        blob[-1] ^= 0x01  # one bit of the payload
        assert cluster.put(ns, {vkeys[1]: bytes(blob)}).stored == 1
    engine.evict_primary()
    engine.rows()[:] = 0

    ctx = engine.request()
    # The lookups promote all three; the load verifies and stops at the corrupt one.
    assert engine.lookup(keys, ctx) == [LookupResult.HIT, LookupResult.MISS, LookupResult.MISS]
    assert engine.loaded(keys[:1], ctx) == [engine.payloads[keys[0]]]
    assert engine.tier.blocks_rejected == 1
    assert [b is None for b in vault_blobs(vault, engine, keys)] == [False, True, False]


def test_chunk_gone_between_lookup_and_load_fails_only_from_there(
    vault: VaultProcess, engine_factory: Any
) -> None:
    engine = engine_factory(kv_cold=vault.address)
    keys = keys_of(4, 3)
    engine.store(keys)
    engine.evict_primary()
    ctx = engine.request()
    first = [engine.manager.lookup(k, ctx) for k in keys]
    assert first == [LookupResult.RETRY] * 3  # answered by the background thread, not on this call
    engine.manager.on_schedule_end(STEP)
    deadline = time.monotonic() + 30
    while engine.tier._lookups.lookup(keys[-1], ctx) is None:  # the vaults answered; no promotion yet
        assert time.monotonic() < deadline
        engine.tier._lookups.flush()
        time.sleep(0.01)
    with Cluster({"kv_cold": [vault.address]}, timeout=5.0) as cluster:
        assert cluster.delete(engine.tier.stream.namespace, engine.tier.vault_keys(keys[1:2])) == 1

    assert engine.lookup(keys, ctx) == [LookupResult.HIT, LookupResult.MISS, LookupResult.MISS]
    assert engine.loaded(keys[:1], ctx) == [engine.payloads[keys[0]]]
    assert engine.tier.blocks_rejected == 0


def test_stopped_vault_misses_and_fails_jobs_without_blocking(
    vault_factory: VaultFactory, engine_factory: Any
) -> None:
    vault = vault_factory()
    engine = engine_factory(kv_cold=vault.address, timeout=1.0)
    stored = keys_of(5, 2)
    engine.store(stored)
    engine.evict_primary()
    vault.stop(timeout=10)

    ctx = engine.request()
    assert engine.lookup(stored, ctx) == [LookupResult.MISS] * 2

    fresh = keys_of(6, 2)
    store_ctx = engine.request()
    out = engine.manager.prepare_store(fresh, store_ctx)
    assert out is not None
    started = time.monotonic()
    engine.manager.complete_store(fresh, store_ctx)  # submits the cascade; returns at once
    assert time.monotonic() - started < 0.5
    engine.settle()
    stats = engine.manager.get_stats()
    assert counter(stats, "cascade_job_failures") == 1
    assert counter(stats, "chunk_hits") == 0


def test_hung_vault_never_blocks_a_scheduler_call(vault_factory: VaultFactory, engine_factory: Any) -> None:
    vault = vault_factory()
    engine = engine_factory(kv_cold=vault.address, timeout=2.0)
    keys = keys_of(7, 3)
    engine.store(keys)
    engine.evict_primary()
    ctx = engine.request()
    slowest = 0.0
    with stopped(vault):
        deadline = time.monotonic() + 30
        results: list[LookupResult] = []
        while time.monotonic() < deadline:
            started = time.monotonic()
            results = [engine.manager.lookup(k, ctx) for k in keys]
            engine.manager.on_schedule_end(STEP)
            slowest = max(slowest, time.monotonic() - started)
            if all(r is LookupResult.MISS for r in results):
                break
            time.sleep(0.02)
    # The vault never answered: every lookup waited in the background, then missed after the deadline,
    # and no scheduler call waited for it (the deadline is 2 s; a call that waited would take that long).
    assert results == [LookupResult.MISS] * 3
    assert slowest < 1.0


def test_tiers_of_other_tenants_share_nothing(vault: VaultProcess, engine_factory: Any) -> None:
    a = engine_factory(kv_cold=vault.address, namespace="tenant-a")
    b = engine_factory(kv_cold=vault.address, namespace="tenant-b")
    keys = keys_of(8, 2)
    a.store(keys)
    assert b.lookup(keys, b.request()) == [LookupResult.MISS] * 2
    assert a.tier.stream.namespace != b.tier.stream.namespace


def test_store_queue_is_bounded(vault: VaultProcess, engine_factory: Any) -> None:
    engine = engine_factory(kv_cold=vault.address, max_queued_stores=1)
    with stopped(vault):  # the first store waits on the hung vault; the next ones find the queue full
        ctx = engine.request()
        for i in range(3):
            keys = keys_of(9, 3)[i : i + 1]
            assert engine.manager.prepare_store(keys, ctx) is not None
            engine.manager.complete_store(keys, ctx)
        assert engine.tier.stores_dropped == 2
    engine.settle()


def test_settings_errors_name_the_key(vault: VaultProcess) -> None:
    with pytest.raises(ConfigError, match="kv_cold"):
        TieringOffloadingSpec(offloading_config({"kv_cold": ""})).get_manager()
    with pytest.raises(ConfigError, match="load_threads"):
        TieringOffloadingSpec(offloading_config({"kv_cold": vault.address, "load_threads": 0})).get_manager()
    with pytest.raises(ConfigError, match="fp8"):
        TieringOffloadingSpec(offloading_config({"kv_cold": vault.address}, dtype="fp8_e4m3")).get_manager()


def test_tier_events_without_vllms_kv_events_say_what_to_start_vllm_with(
    vault: VaultProcess, engine_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``enable_kv_events`` on the tier alone announces nothing (vLLM's events are off): one warning
    naming the key and the flag that turns them on, as vLLM's own tiers warn."""
    with caplog.at_level("WARNING", logger="tierkv"):
        engine = engine_factory(kv_cold=vault.address, events=False, enable_kv_events=True)
    warned = [r.getMessage() for r in caplog.records if "enable_kv_events" in r.getMessage()]
    assert len(warned) == 1 and "--kv-events-config" in warned[0], warned
    keys = keys_of(12, 2)
    engine.store(keys)
    assert not [e for e in engine.manager.take_events() if e.medium.value == "STORAGE"]
