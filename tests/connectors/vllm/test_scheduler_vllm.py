"""The scheduler-side contract, with vLLM's real ``Scheduler`` driven step by step and no model.

Blocks are staged in a real vault under the keys and namespaces the connector itself computes; the
worker side is played by the test, which reports finished transfers the way vLLM's model runner does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

import torch
from vllm import SamplingParams
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from tests.conftest import VaultFactory
from tests.connectors.vllm.clock import StepClock
from tests.connectors.vllm.engine import llama_config, transfer_config
from tests.processes import stopped
from tierkv.client.cluster import Cluster
from tierkv.codec.torch_codec import encode_tensor
from tierkv.connectors.vllm.connector import TierKVConnector, TierKVMetadata
from tierkv.connectors.vllm.plan import KV, StoreJob
from tierkv.errors import ConfigError
from tierkv.vault.launcher import VaultProcess

pytestmark = pytest.mark.vllm

BS = 32
EOS = 999
MAMBA_SHAPES = ((3, 16), (2, 8, 8))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config-only")
    (path / "config.json").write_text(json.dumps(llama_config()))
    init_none_hash(sha256)
    return path


def attention(layers: list[str]) -> KVCacheGroupSpec:
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=32, dtype=torch.float32)
    return KVCacheGroupSpec(layers, spec)


def mamba() -> KVCacheGroupSpec:
    spec = MambaSpec(
        block_size=BS,
        shapes=MAMBA_SHAPES,
        dtypes=(torch.float32, torch.float32),
        mamba_cache_mode="align",
    )
    return KVCacheGroupSpec(["mamba.0"], spec)


def sliding() -> KVCacheGroupSpec:
    spec = SlidingWindowSpec(
        block_size=BS, num_kv_heads=2, head_size=32, dtype=torch.float32, sliding_window=64
    )
    return KVCacheGroupSpec(["swa.0"], spec)


def make_config(model: Path, address: str, *, align: bool = False, **extra: Any) -> VllmConfig:
    return VllmConfig(
        model_config=ModelConfig(model=str(model), dtype="float32", seed=0, skip_tokenizer_init=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=512,
            max_model_len=1024,
            is_encoder_decoder=False,
            enable_chunked_prefill=True,
        ),
        cache_config=CacheConfig(
            block_size=BS, enable_prefix_caching=True, mamba_cache_mode="align" if align else "none"
        ),
        kv_transfer_config=KVTransferConfig(**transfer_config({"kv_cold": address, "timeout": 1.0, **extra})),
        device_config=DeviceConfig("cpu"),
    )


def make_scheduler(
    model: Path,
    address: str,
    groups: list[KVCacheGroupSpec],
    *,
    align: bool = False,
    num_blocks: int = 256,
    **extra: Any,
) -> Scheduler:
    config = make_config(model, address, align=align, **extra)
    config.cache_config.num_gpu_blocks = num_blocks
    kv_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BS,
        log_stats=True,
    )


_ids = iter(range(10**6))


def make_request(
    tokens: list[int],
    max_tokens: int = 2,
    *,
    kv_transfer_params: dict[str, Any] | None = None,
    kv_hints: KvHintsEnvelope | None = None,
) -> Request:
    params = SamplingParams(max_tokens=max_tokens)
    if kv_transfer_params is not None:
        params.extra_args = {"kv_transfer_params": kv_transfer_params}  # what the OpenAI server does
    params.update_from_generation_config({}, EOS)
    return Request(
        request_id=f"r{next(_ids)}",
        prompt_token_ids=tokens,
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(BS, sha256),
        kv_hints=kv_hints,
    )


def tokens(n: int, seed: int) -> list[int]:
    return [(seed * 131 + i * 17) % 900 + 3 for i in range(n)]


def connector(s: Scheduler) -> TierKVConnector:
    assert isinstance(s.connector, TierKVConnector)
    return s.connector


def stage(s: Scheduler, request: Request, blocks: list[int], *, states: list[int] = ()) -> None:
    """Put blobs under the connector's keys: KV blocks of every KV stream, states of the state streams."""
    conn = connector(s)
    keys = conn.keybook.keys(request)
    with Cluster({"kv_cold": conn.settings.kv_cold}, timeout=2.0) as cluster:
        for stream in conn.topology.streams:
            positions = blocks if stream.kind == KV else states
            shape = (2, 2, BS, 64) if stream.kind == KV else (1, *MAMBA_SHAPES[stream.index])
            items = {
                keys[p]: encode_tensor(torch.full(shape, float(p)), tokens=BS, layer_group=stream.layer_group)
                for p in positions
            }
            if items:
                ns = conn.identity.stream_namespace(stream)
                assert cluster.put(ns, items, role=stream.role).stored == len(items)


def step(
    s: Scheduler, *, recving: set[str] = frozenset(), sending: set[str] = frozenset()
) -> SchedulerOutput:
    """One engine step: schedule, then report a sampled token per request and any finished transfers."""
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    s.update_from_output(
        out,
        ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=KVConnectorOutput(
                finished_recving=set(recving), finished_sending=set(sending)
            ),
        ),
    )
    return out


def until(s: Scheduler, request: Request, status: RequestStatus, timeout: float = 10.0) -> SchedulerOutput:
    """Step until ``request`` reaches ``status`` (lookups answer asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        out = step(s)
        if request.status == status:
            return out
        assert time.monotonic() < deadline, f"request stayed {request.status}"
        time.sleep(0.005)


def jobs(out: SchedulerOutput) -> Any:
    meta = out.kv_connector_metadata
    assert isinstance(meta, TierKVMetadata)
    return meta.jobs


@pytest.fixture
def kv_vault(vault_factory: VaultFactory) -> VaultProcess:
    return vault_factory("kv")


def test_lookup_is_asynchronous_and_leaves_the_last_token(model_dir: Path, kv_vault: VaultProcess) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0", "l1"])], lookup_wait_ms=0)
    assert connector(s).scheduler.lookup_lease_ms == 2000, "lookups the engine loads from are leased"
    request = make_request(tokens(4 * BS, seed=1))
    stage(s, request, [0, 1, 2, 3])
    s.add_request(request)

    first = step(s)
    assert first.num_scheduled_tokens == {}, "the first answer must be 'not decided yet'"
    assert request.status == RequestStatus.WAITING

    out = until(s, request, RequestStatus.WAITING_FOR_REMOTE_KVS)
    assert request.num_computed_tokens == 3 * BS, (
        "all 4 blocks are stored but the last token must be computed"
    )
    (load,) = jobs(out).loads
    assert load.req_id == request.request_id
    block_ids = s.kv_cache_manager.get_block_ids(request.request_id)[0]
    assert [r.block_id for r in load.refs] == block_ids[:3]
    assert [r.key for r in load.refs] == connector(s).keybook.keys(request)[:3]

    step(s, recving={request.request_id})
    out = until(s, request, RequestStatus.RUNNING)
    assert out.num_scheduled_tokens[request.request_id] == BS, "only the last block is computed"


def test_a_quick_lookup_is_answered_in_the_step_that_asked(model_dir: Path, kv_vault: VaultProcess) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"])], lookup_wait_ms=1000)
    clock = connector(s).scheduler.clock = StepClock(tick_s=0.002)  # the lookup answers in 2 ms of 1 s
    request = make_request(tokens(4 * BS, seed=2))
    stage(s, request, [0, 1, 2, 3])
    s.add_request(request)
    first = step(s)
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS, "the lookup was waited for, not deferred"
    (load,) = jobs(first).loads
    assert len(load.refs) == 3
    totals = connector(s).counters.totals()
    assert totals["lookups"] == 1 and totals["lookup_us"] > 0
    assert clock.waits == [1.0] and totals["lookup_wait_us"] == 2000


def test_a_hung_vault_costs_a_step_its_wait_budget_only(model_dir: Path, kv_vault: VaultProcess) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"])], lookup_wait_ms=50, timeout=3.0)
    clock = connector(s).scheduler.clock = StepClock(guard_s=0.0)  # no lookup is done when waited for
    requests = [make_request(tokens(4 * BS, seed=30 + i)) for i in range(5)]
    for r in requests:
        s.add_request(r)
    with stopped(kv_vault):
        out = step(s)
        assert out.num_scheduled_tokens == {}, "no lookup finished: every request waits for its answer"
        assert all(r.status == RequestStatus.WAITING for r in requests)
        # five new requests share one 50 ms budget (not 50 ms each); the vault's 3 s deadline is never
        # waited for
        assert clock.waits == [0.05]
        assert connector(s).counters.totals()["lookup_wait_us"] == 50_000
        step(s)
        assert clock.waits == [0.05, 0.05], "the next step waits once more, for the next lookup only"


def test_sync_loads_run_in_the_step_that_schedules_the_request(
    model_dir: Path, kv_vault: VaultProcess
) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"])], load_mode="sync")
    request = make_request(tokens(4 * BS + 5, seed=11))
    stage(s, request, [0, 1, 2, 3])
    s.add_request(request)
    out = until(s, request, RequestStatus.RUNNING)
    assert out.num_scheduled_tokens[request.request_id] == 5, "4 blocks loaded, 5 tokens computed"
    assert out.has_sync_kv_loads
    (load,) = jobs(out).loads
    assert load.sync and len(load.refs) == 4


def test_partial_hit_claims_the_leading_run_only(model_dir: Path, kv_vault: VaultProcess) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"])])
    request = make_request(tokens(6 * BS + 5, seed=2))
    stage(s, request, [0, 1, 3, 4])
    s.add_request(request)
    until(s, request, RequestStatus.WAITING_FOR_REMOTE_KVS)
    assert request.num_computed_tokens == 2 * BS


def test_miss_and_dead_vault_claim_nothing(model_dir: Path, kv_vault: VaultProcess) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"])])
    missing = make_request(tokens(3 * BS, seed=3))
    s.add_request(missing)
    until(s, missing, RequestStatus.RUNNING)
    assert missing.num_computed_tokens == 3 * BS

    kv_vault.kill()
    down = make_request(tokens(3 * BS, seed=4))
    s.add_request(down)
    until(s, down, RequestStatus.RUNNING)
    assert down.num_computed_tokens == 3 * BS


def test_hybrid_claims_only_up_to_a_stored_state(model_dir: Path, kv_vault: VaultProcess) -> None:
    groups = [attention(["l0"]), mamba()]
    s = make_scheduler(model_dir, kv_vault.address, groups, align=True)
    assert connector(s).topology.restorable

    with_state = make_request(tokens(5 * BS, seed=5))
    stage(s, with_state, [0, 1, 2, 3], states=[1])
    s.add_request(with_state)
    out = until(s, with_state, RequestStatus.WAITING_FOR_REMOTE_KVS)
    assert with_state.num_computed_tokens == 2 * BS
    (load,) = jobs(out).loads
    by_group = {g: [(r.position, r.block_id) for r in load.refs if r.group == g] for g in (0, 1)}
    attn_ids, mamba_ids = s.kv_cache_manager.get_block_ids(with_state.request_id)
    assert by_group[0] == [(0, attn_ids[0]), (1, attn_ids[1])]
    assert by_group[1] == [(1, mamba_ids[1])], "the state is loaded into the block of the hit's last position"

    without_state = make_request(tokens(5 * BS, seed=6))
    stage(s, without_state, [0, 1, 2, 3])
    s.add_request(without_state)
    out = until(s, without_state, RequestStatus.RUNNING)
    assert out.num_scheduled_tokens[without_state.request_id] == without_state.num_computed_tokens, (
        "without the state at a block boundary nothing may come from the vault"
    )


def test_unsupported_group_disables_restores(model_dir: Path, kv_vault: VaultProcess) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"]), sliding()])
    conn = connector(s)
    assert not conn.topology.restorable
    assert "SlidingWindowSpec" in conn.topology.unsupported
    request = make_request(tokens(4 * BS, seed=7))
    stage(s, request, [0, 1, 2, 3])
    assert conn.get_num_new_matched_tokens(request, 0) == (0, False)


def test_finished_request_keeps_its_blocks_until_the_store_is_reported(
    model_dir: Path, kv_vault: VaultProcess
) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"])])
    request = make_request(tokens(3 * BS + 4, seed=8), max_tokens=1)
    s.add_request(request)
    until(s, request, RequestStatus.FINISHED_LENGTH_CAPPED)
    assert request.request_id in s.requests, "blocks must stay allocated while the store runs"
    held = s.kv_cache_manager.block_pool.get_num_free_blocks()

    out = step(s)
    (store,) = jobs(out).stores
    assert isinstance(store, StoreJob) and not store.snapshot
    assert [r.position for r in store.refs] == [0, 1, 2]
    assert connector(s).has_pending_push_work()

    step(s, sending={request.request_id})
    assert request.request_id not in s.requests
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() > held
    assert not connector(s).has_pending_push_work()


def test_request_aborted_while_loading_is_not_stored(model_dir: Path, kv_vault: VaultProcess) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"])])
    request = make_request(tokens(4 * BS, seed=10))
    stage(s, request, [0, 1, 2])
    s.add_request(request)
    until(s, request, RequestStatus.WAITING_FOR_REMOTE_KVS)
    s.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
    assert jobs(step(s)).stores == [], "blocks still being loaded hold nothing to store"
    step(s, recving={request.request_id})
    assert request.request_id not in s.requests
    assert not connector(s).has_pending_push_work()


def test_aligned_mamba_boundary_states_become_snapshot_stores(
    model_dir: Path, kv_vault: VaultProcess
) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"]), mamba()], align=True)
    request = make_request(tokens(4 * BS + 3, seed=9), max_tokens=3)
    s.add_request(request)
    snapshots: list[tuple[int, int]] = []
    deadline = time.monotonic() + 10
    while request.request_id in s.requests and time.monotonic() < deadline:
        out = step(s, sending={request.request_id} if request.is_finished() else set())
        for job in jobs(out).stores:
            if job.snapshot:
                snapshots += [(r.group, r.position) for r in job.refs]
    assert snapshots, "vLLM offered no boundary state in align mode"
    assert {g for g, _ in snapshots} == {1}
    keys = connector(s).keybook.keys(request)
    assert all(0 <= pos < len(keys) for _, pos in snapshots)


def test_a_layout_in_kv_transfer_params_or_a_kv_hints_action_tags_the_store_job(
    model_dir: Path, kv_vault: VaultProcess
) -> None:
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"])])
    layout = [{"tokens": [0, 40], "source": "axioms", "priority": 5}, {"tokens": [40, 96], "source": "tools"}]
    hint = KvHintAction("a1", "tierkv.layout", "1", {"layout": layout})
    by_params = make_request(tokens(4 * BS, seed=21), 1, kv_transfer_params={"tierkv": {"layout": layout}})
    by_hints = make_request(tokens(4 * BS, seed=22), 1, kv_hints=KvHintsEnvelope("1", "m1", [hint]))
    bad = make_request(tokens(4 * BS, seed=23), 1, kv_transfer_params={"tierkv": {"layout": [{"tokens": 3}]}})
    plain = make_request(tokens(4 * BS, seed=24), 1)
    requests = [by_params, by_hints, bad, plain]
    for request in requests:
        s.add_request(request)
    stores: dict[str, StoreJob] = {}
    sent: set[str] = set()  # a worker reports a request's sending finished once; vLLM frees it then
    deadline = time.monotonic() + 20
    while len(stores) < len(requests):
        assert time.monotonic() < deadline, f"stored only {sorted(stores)}"
        finished = {r.request_id for r in requests if r.is_finished()}
        sending = (finished & set(stores)) - sent
        sent |= sending
        stores.update({j.req_id: j for j in jobs(step(s, sending=sending)).stores})
        time.sleep(0.005)
    for request in (by_params, by_hints):
        meta = stores[request.request_id].meta
        keys = connector(s).keybook.keys(request)
        assert meta is not None and list(meta) == keys[:4], "every stored block, keyed by its chain key"
        assert [m.source for m in meta.values()] == ["axioms", "axioms", "tools", ""]
        assert [m.parent for m in meta.values()] == [b"", *keys[:3]]
    assert stores[bad.request_id].meta is None and stores[plain.request_id].meta is None
    assert len(stores[bad.request_id].refs) == 4, "a malformed layout is ignored, the request stored"
    totals = connector(s).totals()
    assert totals["layouts"] == 2 and totals["layouts_rejected"] == 1


def test_layout_classes_come_from_the_retention_section_of_tierkv_toml(
    model_dir: Path, kv_vault: VaultProcess, tmp_path: Path
) -> None:
    toml = tmp_path / "tierkv.toml"
    toml.write_text("[retention.classes.tools]\nimportance = 0.3\nprotected = true\n")
    s = make_scheduler(model_dir, kv_vault.address, [attention(["l0"])], config_path=str(toml))
    layout = [{"tokens": [0, 3 * BS], "source": "tools"}]
    request = make_request(tokens(3 * BS, seed=31), 1, kv_transfer_params={"tierkv": {"layout": layout}})
    s.add_request(request)
    until(s, request, RequestStatus.FINISHED_LENGTH_CAPPED)
    (store,) = jobs(step(s)).stores
    assert store.meta is not None and len(store.meta) == 3
    assert all(m.source == "tools" and m.importance == 0.3 and m.protected for m in store.meta.values())


def test_every_counter_has_a_prometheus_description() -> None:
    """vLLM builds the connector's Prometheus metrics at server start; a counter without one fails it."""
    from tierkv.connectors.vllm.metrics import _HELP
    from tierkv.connectors.vllm.stats import COUNTERS

    assert set(_HELP) == set(COUNTERS)


def test_sleep_mode_is_refused_at_start_up(model_dir: Path, kv_vault: VaultProcess) -> None:
    """vLLM 0.33+ asks the connector class (loaded by module path, as a server does) and refuses the
    combination itself; 0.32 does not ask, so the connector refuses it when built."""
    config = make_config(model_dir, kv_vault.address)
    transfer = config.kv_transfer_config
    assert KVConnectorFactory.get_connector_class(transfer).supports_sleep_mode(transfer) is False
    config.model_config.enable_sleep_mode = True  # CPU has no sleep mode: set after vLLM's own checks
    kv_config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[attention(["l0"])])
    with pytest.raises(ConfigError, match="enable_sleep_mode: sleep mode frees and remaps the KV cache"):
        TierKVConnector(config, KVConnectorRole.SCHEDULER, kv_config)


def test_cold_events_without_vllms_kv_events_say_what_to_start_vllm_with(
    model_dir: Path, kv_vault: VaultProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """``kv_events: true`` alone publishes nothing (vLLM drops events unless ``--kv-events-config`` turns
    them on): the connector says so once, naming the flag, and builds no events (no audit lookups)."""
    from vllm.config import KVEventsConfig

    kv_config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[attention(["l0"])])
    config = make_config(model_dir, kv_vault.address, kv_events=True)
    with caplog.at_level("WARNING", logger="tierkv"):
        off = TierKVConnector(config, KVConnectorRole.SCHEDULER, kv_config)
    warned = [r.getMessage() for r in caplog.records if "kv_events" in r.getMessage()]
    assert len(warned) == 1 and "--kv-events-config" in warned[0], warned
    assert list(off.take_events()) == [] and off._events is None
    off.shutdown()
    caplog.clear()
    config.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    with caplog.at_level("WARNING", logger="tierkv"):
        on = TierKVConnector(config, KVConnectorRole.SCHEDULER, kv_config)
    assert on._events is not None and not [r for r in caplog.records if "kv_events" in r.getMessage()]
    on.shutdown()
