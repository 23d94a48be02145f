"""``TierKVConnector``: vLLM's KV connector (v1 API, hybrid allocator aware) backed by tierkv vaults.

Launch::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "TierKVConnector",
        "kv_connector_module_path": "tierkv.connectors.vllm.connector", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"config_path": "/etc/tierkv/tierkv.toml"}}'

``kv_role`` ``kv_both`` stores and restores; ``kv_producer`` only stores, ``kv_consumer`` only restores.
A block that fails to load (evicted, lost or corrupt in the vaults, a vault down) is recomputed, never
used and never an error: the connector runs the scheduler with ``kv_load_failure_policy: recompute``
unless its extra config says ``"load_failure": "engine"`` (then vLLM's default, ``fail``, ends such a
request with an error).

vLLM builds two instances: the SCHEDULER one decides (:mod:`.scheduler`), each WORKER one moves bytes
(:mod:`.worker`); they share nothing but the :class:`TierKVMetadata` vLLM passes from one to the other
every step. The scheduler one also keeps the GPU prefix-cache blocks of protected prompt prefixes out of
eviction, within a cap, by holding a reference on them (:mod:`.protect`). A request's prompt layout
(``kv_transfer_params`` or a ``kv_hints`` action, see :mod:`.hints`) rides in the store jobs as block
metadata, its classes from ``[retention]`` of tierkv.toml. With ``"store": "eviction"`` finished requests
are not shipped; cached blocks are, shortly before vLLM reuses them (:mod:`.eviction`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
import vllm
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, MambaSpec, MLAAttentionSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from tierkv.config import retention_from_config
from tierkv.connectors.vllm.events import ColdEvents, WorkerReport
from tierkv.connectors.vllm.eviction import EvictionStore
from tierkv.connectors.vllm.identity import Identity, KeyBook, choose_hash_scheme, make_identity
from tierkv.connectors.vllm.layout import (
    AttentionGeometry,
    KVGroupView,
    StateGroupView,
    attention_view,
    layer_tensor,
    state_tensors,
)
from tierkv.connectors.vllm.logs import join_vllm_log
from tierkv.connectors.vllm.metrics import TierKVPromMetrics, TierKVStats
from tierkv.connectors.vllm.plan import KV, STATE, GroupPlan, StepJobs, Stream, Topology, make_topology
from tierkv.connectors.vllm.pool import guard_reset
from tierkv.connectors.vllm.protect import GpuProtector, request_candidates
from tierkv.connectors.vllm.scheduler import SchedulerSide
from tierkv.connectors.vllm.settings import ConnectorSettings, load_failure_policy
from tierkv.connectors.vllm.stats import Counters
from tierkv.connectors.vllm.versions import check_vllm
from tierkv.connectors.vllm.worker import GroupView, WorkerSide
from tierkv.errors import ConfigError
from tierkv.tiering import Storage

if TYPE_CHECKING:
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SLEEP_MODE_REFUSED = (
    "sleep mode frees and remaps the KV cache under the connector's loads and stores in flight; "
    "TierKVConnector does not support it: start vLLM without --enable-sleep-mode"
)
IDLE_WAIT_S = 0.005
"""How long a step with nothing to compute may wait for a running transfer to finish."""


class TierKVMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """This step's loads and stores, pickled from the scheduler to every worker.

    ``idle`` says the step computes nothing, so the worker may wait a moment for its transfers.
    """

    def __init__(self, jobs: StepJobs, idle: bool = False) -> None:
        self.jobs = jobs
        self.idle = idle


KV_EVENTS_OFF = (
    "kv_connector_extra_config: kv_events: vLLM publishes no KV events, so the cold tier announces nothing; "
    'start vLLM with --kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq"}\' '
    "or drop kv_events"
)


def publishes_kv_events(vllm_config: VllmConfig) -> bool:
    """Whether vLLM publishes KV events at all (``--kv-events-config``): without it the scheduler hands
    the connector's events to a publisher that drops them, so building them (and auditing the vaults for
    them) would be work for nothing."""
    events = vllm_config.kv_events_config
    return events is not None and bool(events.enable_kv_cache_events)


class TierKVWorkerReport(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """One worker's step report with ``store: "eviction"``: held store jobs it finished (job -> number
    of workers, summed across workers by vLLM's aggregation) and its cold-event report, if any."""

    def __init__(self, jobs: dict[str, int], events: KVConnectorWorkerMetadata | None = None) -> None:
        self.jobs = jobs
        self.events = events

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if not isinstance(other, TierKVWorkerReport):
            return self
        jobs = dict(self.jobs)
        for job_id, count in other.jobs.items():
            jobs[job_id] = jobs.get(job_id, 0) + count
        events = self.events if other.events is None else other.events
        if self.events is not None and other.events is not None:
            events = self.events.aggregate(other.events)
        return TierKVWorkerReport(jobs, events)


def classify_groups(kv_cache_config: KVCacheConfig, hash_block_size: int) -> Topology:
    """Map vLLM's KV-cache groups onto what tierkv can store and restore exactly.

    Full attention (and MLA) groups are stored block by block to ``kv_cold``; Mamba groups in
    ``align`` mode have their block-boundary states stored to ``ssm_cold``. Any other group (sliding
    window, chunked local attention, Mamba without aligned states, quantized or packed caches) makes
    restores unsafe, so the topology records why and the connector claims nothing.
    """
    groups: list[GroupPlan] = []
    skipped: list[str] = []
    transfer = set(kv_cache_config.transfer_group_ids)
    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        if gid not in transfer:
            continue
        spec = group.kv_cache_spec
        names = tuple(group.layer_names)
        kind = type(spec).__name__
        if isinstance(spec, FullAttentionSpec) and type(spec) in (FullAttentionSpec, MLAAttentionSpec):
            plain = (
                spec.num_head_slots is None
                and spec.state_content_bytes is None
                and spec.tokens_per_state == 1
                and spec.dtype in SUPPORTED_DTYPES
            )
            if plain:
                groups.append(GroupPlan(gid, KV, spec.block_size, names))
            else:
                skipped.append(f"group {gid} ({kind}, {spec.dtype}) uses a packed or quantized cache")
        elif isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "align":
            if spec.num_speculative_blocks == 0:
                groups.append(GroupPlan(gid, STATE, spec.block_size, names))
            else:
                skipped.append(f"group {gid} ({kind}) keeps speculative state blocks")
        elif isinstance(spec, MambaSpec):
            skipped.append(f"group {gid} (Mamba, mamba_cache_mode={spec.mamba_cache_mode!r}, needs 'align')")
        else:
            skipped.append(f"group {gid} ({kind})")
    return make_topology(groups, skipped, hash_block_size)


def _worker_ranks() -> tuple[int, int]:
    """(TP rank, PP rank) of this worker; (0, 0) when vLLM's process groups are not set up."""
    from vllm.distributed import parallel_state

    try:
        return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pp_group().rank_in_group
    except (AssertionError, AttributeError, RuntimeError):
        return 0, 0


class TierKVConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """Stores finished requests' KV blocks in tierkv vaults and restores shared prefixes from them."""

    _cache_hit_source = CacheHitSource.DISK

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        check_vllm(vllm.__version__)
        if kv_cache_config is None:
            raise ConfigError(
                "vllm", "kv_cache_config", "TierKVConnector needs vLLM >= 0.11 (3-argument API)"
            )
        if vllm_config.model_config is not None and vllm_config.model_config.enable_sleep_mode:
            # vLLM 0.33+ asks supports_sleep_mode() itself; 0.32 does not, so refuse it here as well
            raise ConfigError("vllm", "enable_sleep_mode", SLEEP_MODE_REFUSED)
        join_vllm_log()
        super().__init__(vllm_config, role, kv_cache_config)
        transfer = self._kv_transfer_config
        self.settings = ConnectorSettings.from_extra(transfer.kv_connector_extra_config)
        self.counters = Counters()
        self._announce = self.settings.kv_events and publishes_kv_events(vllm_config)
        if self.settings.kv_events and not self._announce and role == KVConnectorRole.SCHEDULER:
            logger.warning(KV_EVENTS_OFF)
        cache = vllm_config.cache_config
        hash_block_size = kv_cache_config.hash_block_size or cache.hash_block_size or cache.block_size
        self.topology = classify_groups(kv_cache_config, hash_block_size)
        self.identity = self._make_identity(vllm_config, kv_cache_config)
        self._group_block_sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        self._events: ColdEvents | None = None
        self._eviction: EvictionStore | None = None
        self._protect = GpuProtector(
            self.settings.gpu_protect_fraction, self.settings.gpu_protect_watermark, self.counters
        )
        if role == KVConnectorRole.SCHEDULER:
            self._choose_failure_policy(transfer)
            scheme = choose_hash_scheme(
                self.settings.hash, str(cache.prefix_caching_hash_algo), os.environ.get("PYTHONHASHSEED")
            )
            self.keybook = KeyBook(self.identity, self.topology, scheme)
            if self._announce:
                self._events = ColdEvents(
                    self.topology.block_size,
                    self.topology.hash_block_size,
                    self.settings.max_queued_events,
                    self.counters,
                )
            if self.settings.store == "eviction":
                parallel = vllm_config.parallel_config
                bs = self.topology.block_size
                per_step = -(-vllm_config.scheduler_config.max_num_batched_tokens // bs)
                restore = -(-vllm_config.model_config.max_model_len // bs)
                self._eviction = EvictionStore(
                    self.topology,
                    self.settings.evict_lookahead or 2 * per_step + restore,
                    self.settings.evict_remember,
                    self.counters,
                    workers=parallel.tensor_parallel_size * parallel.pipeline_parallel_size,
                )
            self._scheduler = SchedulerSide(
                self.topology,
                {s: self.identity.all_ranks(s) for s in self.topology.streams},
                self.open_storage,
                self.keybook.keys,
                forget=self.keybook.forget,
                restores=transfer.is_kv_consumer,
                stores=transfer.is_kv_producer,
                sync_loads=self.settings.load_mode == "sync",
                max_state_probes=self.settings.max_state_probes,
                lookup_threads=self.settings.lookup_threads,
                lookup_lease_ms=self.settings.lookup_lease_ms,
                lookup_wait_s=self.settings.lookup_wait_ms / 1000,
                lookup_on_arrival=self.settings.lookup_on_arrival,
                counters=self.counters,
                retention=retention_from_config(self.settings.config),
                events=self._events,
                eviction=self._eviction,
            )
            if self._events is not None:
                self._events.watch(self._scheduler.vault_hits)
            logger.info(
                "tierkv connector: %d group(s), block size %d, keys %s, vaults %s, restores %s, "
                "namespace %s %s",
                len(self.topology.groups),
                self.topology.block_size,
                scheme.split(":")[0],
                ",".join(self.settings.kv_cold),
                "on" if self.topology.restorable else f"off ({self.topology.unsupported})",
                self.identity.base.hex[:16],
                self.identity.base.to_dict(),
            )

    def _choose_failure_policy(self, transfer: Any) -> None:
        """Set the scheduler's ``kv_load_failure_policy`` (read by vLLM right after this connector is
        built) per :func:`~tierkv.connectors.vllm.settings.load_failure_policy`."""
        configured = transfer.kv_load_failure_policy
        policy = load_failure_policy(self.settings.load_failure, configured)
        if policy != configured:
            transfer.kv_load_failure_policy = policy
            logger.info(
                "kv_load_failure_policy %r -> %r: a block that fails to load from the vaults is recomputed "
                '(set "load_failure": "engine" in kv_connector_extra_config to keep %r)',
                configured,
                policy,
                configured,
            )
        elif policy != "recompute":
            logger.warning(
                "kv_load_failure_policy=%r and load_failure=engine: a block that fails to load fails its "
                "request",
                policy,
            )

    def _make_identity(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> Identity:
        model_config = vllm_config.model_config
        parallel = vllm_config.parallel_config
        hf_config = model_config.hf_config.to_dict() if model_config.hf_config is not None else {}
        groups = kv_cache_config.kv_cache_groups
        dtype = getattr(groups[0].kv_cache_spec if groups else None, "dtype", model_config.dtype)
        return make_identity(
            hf_config,
            model=self.settings.model_id or str(model_config.model),
            dtype=str(dtype),
            codec=self.settings.codec,
            block_size=self.topology.block_size,
            kv_layout=str(kv_cache_config.kv_cache_layout or vllm_config.cache_config.kv_cache_layout or ""),
            tp_world=parallel.tensor_parallel_size,
            pp_world=parallel.pipeline_parallel_size,
            tenant=self.settings.namespace,
        )

    def open_storage(self) -> Storage:
        """The vaults of this connector's settings; each half calls it on first use, in its own process.

        The one place the connector gets its storage. A subclass, loaded by vLLM through
        ``kv_connector_module_path`` as this class is, may return another (the conformance kit hands it
        an in-process storage with faults, or a cluster of its own); how users configure the connector
        does not change."""
        return self.settings.cluster()

    @property
    def scheduler(self) -> SchedulerSide:
        if self._scheduler is None:
            raise RuntimeError("scheduler-side method called on a worker connector")
        return self._scheduler

    @property
    def worker(self) -> WorkerSide:
        if self._worker is None:
            raise RuntimeError("worker-side method called before register_kv_caches")
        return self._worker

    @property
    def requires_kv_delivery(self) -> bool:
        """A dropped store is a later miss, not lost output: never make vLLM wait on delivery."""
        return False

    def totals(self) -> dict[str, int]:
        """Cumulative counters of this instance (scheduler or worker half)."""
        return self.counters.totals()

    # -- worker side -------------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        kv_cache_config = self._kv_cache_config
        hint = str(kv_cache_config.kv_cache_layout or "")
        views: dict[Stream, GroupView] = {}
        for group in self.topology.groups:
            spec: Any = kv_cache_config.kv_cache_groups[group.index].kv_cache_spec
            names = [n for n in group.layer_names if n in kv_caches]
            if not names:
                continue
            if group.kind == KV:
                geometry = AttentionGeometry(
                    num_blocks=kv_cache_config.num_blocks,
                    num_kv_heads=spec.num_kv_heads,
                    block_size=spec.block_size,
                    head_size=spec.head_size,
                    head_size_v=spec.head_size_v,
                    mla=isinstance(spec, MLAAttentionSpec),
                )
                layers = [attention_view(n, layer_tensor(n, kv_caches), geometry, hint) for n in names]
                views[group.streams[0]] = KVGroupView(layers)
            else:
                (stream,) = group.streams
                views[stream] = StateGroupView(names, [state_tensors(n, kv_caches[n]) for n in names])
        tp_rank, pp_rank = _worker_ranks()
        self._worker = WorkerSide(
            self.topology,
            views,
            {s: self.identity.stream_namespace(s, tp_rank, pp_rank) for s in self.topology.streams},
            self.open_storage,
            codec=self.settings.codec,
            max_inflight_stores=self.settings.max_inflight_stores,
            max_queued_stores=self.settings.max_queued_stores,
            load_threads=self.settings.load_threads,
            counters=self.counters,
            report=WorkerReport() if self._announce else None,
            prefetch_bytes=self.settings.config.cluster.prefetch_bytes,
            prefetch_timeout_s=self.settings.config.cluster.prefetch_timeout_s,
            decode_behind=self.settings.config.cluster.decode_behind,
        )
        logger.info("tierkv worker (tp %d, pp %d): %d stream(s) registered", tp_rank, pp_rank, len(views))

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if isinstance(meta, TierKVMetadata) and meta.jobs:
            self.worker.submit(meta.jobs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads are whole-request and asynchronous: nothing waits per layer."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        """Stores happen when a request finishes, not layer by layer during the forward."""

    def wait_for_save(self) -> None:
        """Stores run in the background; vLLM keeps their blocks until ``finished_sending``."""

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        meta = self._connector_metadata
        if isinstance(meta, TierKVMetadata) and meta.idle:
            self.worker.wait_for_progress(IDLE_WAIT_S)
        sending, recving, failed = self.worker.finished(finished_req_ids)
        return KVConnectorTransferResults(
            finished_sending=sending, finished_recving=recving | failed, failed_recving=failed
        )

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        """Keys the vaults acknowledged or lost since the last step, for the scheduler's KV events; with
        ``store: "eviction"`` also the held store jobs finished (:class:`TierKVWorkerReport`)."""
        if self._worker is None:
            return None
        events = self._worker.report.take() if self._worker.report is not None else None
        if self.settings.store != "eviction":
            return events
        jobs = dict.fromkeys(self._worker.take_held_done(), 1)
        return TierKVWorkerReport(jobs, events) if jobs or events else None

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self._worker is None or not self._worker.per_block_errors:
            return set()
        return self._worker.take_load_errors()

    def shutdown(self) -> None:
        self._protect.release_all()
        if self._eviction is not None:
            self._eviction.release_all()
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self._events is not None:
            self._events.close()

    # -- scheduler side ----------------------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        self.scheduler.track(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.scheduler.matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if num_external_tokens > 0:
            self.scheduler.after_alloc(request, blocks.get_block_ids(), num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        state = getattr(scheduler_output, "kv_connector_block_state", None)
        offers = state.boundary_state_offloads if state is not None else {}
        idle = scheduler_output.total_num_scheduled_tokens == 0
        self._protect.relieve()
        preempted = scheduler_output.preempted_req_ids or ()
        self.scheduler.evictions(preempted, make_block_hash_with_group_id)
        return TierKVMetadata(self.scheduler.take_jobs(offers), idle=idle)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, TierKVWorkerReport):
            if self._eviction is not None:
                self._eviction.done(meta.jobs)
            meta = meta.events
        if self._events is not None:
            self._events.report(meta)
        self.scheduler.transfers_done(
            set(connector_output.finished_sending or ()), set(connector_output.finished_recving or ())
        )

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        if self._protect.enabled:
            side = self.scheduler
            offered = request_candidates(
                side.layout(request),
                request.num_prompt_tokens,
                block_ids,
                self._group_block_sizes,
                self.topology.block_size,
                side.layouts.retention,
            )
            self._protect.protect(offered)
        return self.scheduler.finished(request, block_ids), None

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        """Hot-tier protection (:mod:`.protect`) and store on eviction (:mod:`.eviction`) hold references
        in this pool; one guard on its prefix-cache reset serves both, store jobs first (a reset they
        refuse releases no protected block)."""
        guards: list[Callable[[], bool]] = []
        if self._eviction is not None:
            self._eviction.bind(gpu_block_pool)
            guards.append(self._eviction.before_reset)
        if self._scheduler is not None and self.settings.gpu_protect_fraction > 0:
            self._protect.bind(gpu_block_pool)
            guards.append(self._protect.before_reset)
        if guards:
            guard_reset(gpu_block_pool, *guards)

    def has_pending_block_frees(self) -> bool:
        """Blocks held for stores come back soon, and vLLM asks this just before it preempts: held
        protected blocks are released then, so vLLM waits a step for them instead of preempting."""
        return self._pending_stores() or self._protect.make_room()

    def _pending_stores(self) -> bool:
        held = self._eviction is not None and self._eviction.pending
        return held or (self._scheduler is not None and self._scheduler.pending_stores > 0)

    def has_pending_push_work(self) -> bool:
        """Keep the engine stepping until blocks kept for stores are released (stores reported done)."""
        return self._pending_stores()

    def take_events(self) -> Iterable[KVCacheEvent]:
        """Cold-tier ``BlockStored`` / ``BlockRemoved`` (medium ``STORAGE``) with ``kv_events: true``."""
        return self._events.take() if self._events is not None else ()

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        """No (vLLM 0.33+ asks this and refuses ``--enable-sleep-mode`` with its own message): the worker
        keeps views of the KV tensors and transfers in flight on them across steps, and sleep frees that
        memory and maps it anew on wake-up. Draining and re-registering is not implemented."""
        return False

    def reset_cache(self) -> bool | None:
        """Forget pending lookups; the vaults are shared and persistent, so their contents stay."""
        if self._scheduler is not None:
            self._scheduler.forget_lookups()
        return True

    # -- stats -------------------------------------------------------------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        data = self.counters.take()
        return TierKVStats(data=dict(data)) if data else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return TierKVStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return TierKVPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)


__all__ = ["TierKVConnector", "TierKVMetadata", "classify_groups"]
