"""tierkv as a secondary tier of vLLM's own KV offloading: GPU → vLLM's CPU tier → tierkv vaults.

vLLM 0.32's ``OffloadingConnector`` with ``TieringOffloadingSpec`` keeps a CPU DRAM tier of its own
(the *primary*) and cascades every chunk stored there to its *secondary* tiers; a chunk found only in a
secondary tier is promoted back into the primary before the GPU reads it. This module is such a
secondary tier, loaded by ``module_path``, no vLLM patch::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8000000000,
            "secondary_tiers": [{"type": "TierKVSecondaryTier",
                                 "module_path": "tierkv.connectors.vllm.secondary",
                                 "config_path": "/etc/tierkv/tierkv.toml", "namespace": "tenant-a"}]}}'

What vLLM does and what this tier does
    vLLM decides what to store and when (every chunk that reaches its CPU tier), pins the primary slots
    while a job runs, applies its back-pressure (``"backpressure": {...}`` in the tier's config drops
    stores when the tier's latency rises) and counts the tier's reads, writes, hits and failed jobs in
    its own Prometheus metrics. This tier answers lookups, ships pinned primary chunks to the vaults and
    fetches them back into the primary slots vLLM allocated — through :mod:`tierkv.tiering`, like every
    other hook: a chunk is one raw blob, verified (checksums, header) before a byte of it is written into
    the primary tier, and a corrupt one is deleted from the vaults.

Never blocking the scheduler
    Every method vLLM calls returns at once. Lookups are batched once per step and answered by a
    background thread (vLLM's own ``AsyncLookupManager``: ``RETRY`` until the vaults answered); stores
    and loads run on small thread pools and report through :meth:`get_finished_jobs`. At most
    ``max_queued_stores`` store jobs wait; a store beyond that fails at once (the chunk stays in the CPU
    tier only). A vault that is down or hung is a miss and a failed job after the cluster's deadline.

Keys and namespace
    A key is vLLM's offloading key (block hash + KV group) moved into a tierkv namespace
    (:func:`tierkv.keys.wrap_engine_hashes`). The namespace covers the model (``model_id`` overrides its
    name), the KV dtype, the primary tier's chunk layout (vLLM's own layout identity: groups and their
    layers, tokens per block, blocks per chunk, parallel sizes, canonical format; and the chunk size),
    the seed of vLLM's block hashes and the tenant (``namespace``). So engines that lay chunks out
    differently, or hash differently, never share blocks.

A chunk holds every layer of every worker (and the page padding) as vLLM's CPU tier lays it out, so it
is stored losslessly (``raw``) under the KV dtype; the int8 codec, which needs to know where values
are, is the business of :mod:`tierkv.connectors.vllm.connector`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from vllm.v1.core.kv_cache_utils import get_none_hash_seed
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingSpec,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    get_offload_group_idx,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from tierkv.codec import DTYPES, LayerGroup
from tierkv.config import Addresses, ClusterConfig, Config, load_config, setting, settings_from_dict
from tierkv.connectors.vllm.logs import join_vllm_log
from tierkv.errors import ConfigError
from tierkv.keys import Namespace, canonical_dtype, wrap_engine_hashes
from tierkv.roles import Role
from tierkv.tiering import ColdTier, Expect, LazyStorage, NumpyArrays, Storage, StreamSpec, open_cluster

log = logging.getLogger(__name__)

SOURCE = "secondary_tiers[TierKVSecondaryTier]"
LAYOUT = "vllm-tiering-v1"
"""Version of this tier's blob layout (one primary chunk per blob); part of the namespace."""


@dataclasses.dataclass(frozen=True)
class TierSettings:
    """The tier's own keys in its ``secondary_tiers`` entry, on top of tierkv.toml (``config_path``).

    ``kv_cold`` and ``timeout`` come from the file unless given inline; ``namespace`` is the tenant,
    ``model_id`` names the weights where vLLM's model name does not (a revision, a fine-tune).
    """

    config_path: str = ""
    kv_cold: Addresses = Addresses()
    timeout: float = setting(ClusterConfig.timeout, minimum=0.001)
    namespace: str = ""
    model_id: str = ""
    load_threads: int = setting(2, minimum=1, maximum=64)
    store_threads: int = setting(1, minimum=1, maximum=64)
    max_queued_stores: int = setting(16, minimum=1)
    config: Config = dataclasses.field(default=Config(), metadata={"internal": True})

    @classmethod
    def from_tier_config(cls, given: Mapping[str, Any]) -> TierSettings:
        settings = settings_from_dict(cls, given, SOURCE)
        config = load_config(settings.config_path or None)
        inherited: dict[str, Any] = {}
        if "kv_cold" not in given:
            inherited["kv_cold"] = Addresses(config.cluster.addresses(Role.KV_COLD))
        if "timeout" not in given:
            inherited["timeout"] = config.cluster.timeout
        settings = dataclasses.replace(settings, config=config, **inherited)
        if not settings.kv_cold:
            raise ConfigError(SOURCE, "kv_cold", "at least one kv_cold vault is needed")
        return settings

    def storage(self) -> Storage:
        """The vaults, opened on first use (by a background thread, never the scheduler's)."""
        roles = {Role.KV_COLD.value: self.kv_cold}
        return LazyStorage(lambda: open_cluster(self.config, roles=roles, timeout=self.timeout))


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
    """How one primary chunk becomes one blob: its values (dtype, count) and its token span per group."""

    dtype: str
    values: int
    tokens_per_group: tuple[int, ...]

    @classmethod
    def of(cls, spec: OffloadingSpec, chunk_bytes: int) -> ChunkLayout:
        dtype = canonical_dtype(spec.config.model.dtype)
        if dtype not in DTYPES:
            raise ConfigError(
                SOURCE,
                "kv_cache_dtype",
                f"KV dtype {dtype!r} is not stored yet; expected one of {sorted(DTYPES)}",
            )
        itemsize = DTYPES[dtype].itemsize
        if chunk_bytes % itemsize:
            raise ConfigError(
                SOURCE, "cpu tier", f"a chunk of {chunk_bytes} bytes is not whole {dtype} values"
            )
        per_chunk = spec.config.cache.blocks_per_chunk
        tokens = tuple(g.tokens_per_block * per_chunk for g in spec.config.groups)
        return cls(dtype, chunk_bytes // itemsize, tokens)

    def tokens(self, key: OffloadKey) -> int:
        group = get_offload_group_idx(key)
        return self.tokens_per_group[group] if group < len(self.tokens_per_group) else 0

    def rows(self, primary: memoryview) -> npt.NDArray[Any]:
        """The primary tier's memory as one writable row of values per chunk (no copy)."""
        flat = np.frombuffer(primary, np.uint8)
        return flat.view(DTYPES[self.dtype].storage).reshape(-1, self.values)


def chunk_namespace(
    spec: OffloadingSpec, layout: ChunkLayout, settings: TierSettings, seed: str
) -> Namespace:
    """The namespace of this engine's chunks (see the module docstring for what it covers)."""
    mapper = FileMapper.from_offloading_spec(
        "", spec, blocks_per_file=spec.config.cache.blocks_per_chunk, parallel_agnostic=True
    )
    run = json.dumps(mapper.get_run_config(), sort_keys=True, separators=(",", ":"))
    return Namespace(
        model=settings.model_id or spec.config.model.name,
        dtype=layout.dtype,
        codec="raw",
        layout=f"{LAYOUT}/values{layout.values}/{hashlib.sha256(run.encode()).hexdigest()}",
        tenant=settings.namespace,
        extra={"hash_seed": hashlib.sha256(seed.encode()).hexdigest()},
    )


class _VaultLookups(AsyncLookupManager):  # type: ignore[misc]
    """vLLM's batched background lookups, answered by the vaults (one prefix lookup per request)."""

    def __init__(self, probe: Callable[[Sequence[OffloadKey]], int], tier_type: str) -> None:
        self._probe = probe
        super().__init__(tier_type=tier_type)

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        # A request's keys arrive in prefix order; those after the leading run count as missing, which
        # can only cost a hit, never claim one.
        present = self._probe(keys)
        return [i < present for i in range(len(keys))]


TIER_EVENTS_OFF = (
    "secondary tier %s: enable_kv_events: vLLM publishes no KV events, so the tier announces nothing; "
    'start vLLM with --kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq"}\' '
    "or drop enable_kv_events"
)


class TierKVSecondaryTier(SecondaryTierManager):  # type: ignore[misc]
    """tierkv vaults behind vLLM's CPU offloading tier (see the module docstring)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        locality: str | None = None,
        enable_kv_events: bool = False,
        **settings: Any,
    ) -> None:
        join_vllm_log()
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality(locality) if locality is not None else Locality.REMOTE
        self.settings = TierSettings.from_tier_config(settings)
        self.layout = ChunkLayout.of(offloading_spec, self.block_size_bytes)
        self._rows = self.layout.rows(primary_kv_view)
        self._storage = self.settings.storage()
        self._tier = ColdTier(self._storage, NumpyArrays(self.layout.dtype))
        self._namespace: Namespace | None = None
        self._stream_lock = threading.Lock()
        published = bool(offloading_spec.kv_events_config.enable_kv_cache_events)
        self._events: list[OffloadingEvent] | None = [] if enable_kv_events and published else None
        if enable_kv_events and not published:
            log.warning(TIER_EVENTS_OFF, tier_type)
        self._results: queue.SimpleQueue[tuple[JobResult, list[OffloadKey], bool]] = queue.SimpleQueue()
        self._pending: set[Future[None]] = set()
        self._pending_lock = threading.Lock()
        self._queued_stores = 0
        self._loads = ThreadPoolExecutor(self.settings.load_threads, thread_name_prefix="tierkv-tier-load")
        self._stores = ThreadPoolExecutor(self.settings.store_threads, thread_name_prefix="tierkv-tier-store")
        self._lookups = _VaultLookups(self._probe, tier_type)
        self.stores_dropped = 0
        self.blocks_rejected = 0

    # -- identity (resolved on first use: vLLM seeds its block hashes after building the tiers) --------

    @property
    def namespace(self) -> Namespace:
        with self._stream_lock:
            if self._namespace is None:
                ns = chunk_namespace(self._offloading_spec, self.layout, self.settings, get_none_hash_seed())
                log.info("tierkv tier: namespace %s (%s)", ns.hex[:16], ns.to_dict())
                self._namespace = ns
            return self._namespace

    @property
    def stream(self) -> StreamSpec:
        return StreamSpec(self.namespace.digest, LayerGroup.ATTENTION, "raw")

    def vault_keys(self, keys: Iterable[OffloadKey]) -> list[bytes]:
        """Where ``keys`` live in the vaults."""
        return wrap_engine_hashes(self.namespace, list(keys))

    # -- scheduler-side calls: all return at once ----------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        with self._pending_lock:
            full = self._queued_stores >= self.settings.max_queued_stores
            if not full:
                self._queued_stores += 1
        if full:
            self.stores_dropped += 1
            self._results.put((JobResult(job_metadata.job_id, False), keys, False))
            return
        self._start(self._stores, self._store, job_metadata, keys)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._start(self._loads, self._load, job_metadata, list(job_metadata.keys))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results: list[JobResult] = []
        while True:
            try:
                result, keys, is_load = self._results.get_nowait()
            except queue.Empty:
                return results
            results.append(result)
            self._settle(result, keys, is_load)

    def _settle(self, result: JobResult, keys: list[OffloadKey], is_load: bool) -> None:
        """Scheduler-thread bookkeeping of one finished job."""
        if is_load and not result.success:
            # vLLM's livelock guard (#49176): stop promoting what just failed to load.
            loaded = set(result.successful_keys or ())
            self._lookups.mark_miss([k for k in keys if k not in loaded])
        elif not is_load and result.success and self._events is not None:
            self._events.append(
                OffloadingEvent(keys=keys, medium=self.medium, removed=False, locality=self.locality)
            )

    def has_pending_work(self) -> bool:
        with self._pending_lock:
            return bool(self._pending) or not self._results.empty()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events:
            events, self._events = self._events, []
            yield from events

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        """Wait for every submitted job (each is bounded by the cluster's deadline); results stay queued."""
        with self._pending_lock:
            pending = list(self._pending)
        wait(pending)

    def shutdown(self) -> None:
        self._lookups.shutdown()
        self._loads.shutdown(wait=True)
        self._stores.shutdown(wait=True)
        self._storage.close()
        # Let go of vLLM's memory: an array over it would keep vLLM from unmapping its region.
        self._rows = self._rows[:0].copy()

    # -- background work -----------------------------------------------------------------------------

    def _probe(self, keys: Sequence[OffloadKey]) -> int:
        return self._tier.lookup(self.stream, self.vault_keys(keys))

    def _start(
        self,
        pool: ThreadPoolExecutor,
        run: Callable[[TransferJob, list[OffloadKey]], JobResult],
        job: TransferJob,
        keys: list[OffloadKey],
    ) -> None:
        is_load = pool is self._loads

        def task() -> None:
            started = time.perf_counter()
            try:
                result = run(job, keys)
            except Exception:  # a bug must not leak pinned primary slots: the job still reports
                log.exception("tierkv tier: job %d failed", job.job_id)
                result = JobResult(job.job_id, False)
            result.transfer_time = time.perf_counter() - started
            if not is_load:
                with self._pending_lock:
                    self._queued_stores -= 1
            self._results.put((result, keys, is_load))

        with self._pending_lock:
            future = pool.submit(task)
            self._pending.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[None]) -> None:
        with self._pending_lock:
            self._pending.discard(future)

    def _store(self, job: TransferJob, keys: list[OffloadKey]) -> JobResult:
        blocks = (
            (vkey, self._rows[int(cid)], self.layout.tokens(key))
            for vkey, key, cid in zip(self.vault_keys(keys), keys, job.chunk_ids, strict=True)
        )
        tally = self._tier.store(self.stream, blocks)
        ok = tally.stored == len(keys)
        return JobResult(job.job_id, ok, transfer_bytes=len(keys) * self.block_size_bytes if ok else None)

    def _load(self, job: TransferJob, keys: list[OffloadKey]) -> JobResult:
        stream = self.stream
        slots = [int(cid) for cid in job.chunk_ids]
        expect = [self._expect(stream, key) for key in keys]
        restored = self._tier.restore(
            stream, self.vault_keys(keys), expect, lambda n: self._rows[slots[n]], leading_only=True
        )
        self.blocks_rejected += restored.rejected
        done = restored.leading
        if done < len(keys):
            log.info("tierkv tier: %d of %d chunks loaded (job %d)", done, len(keys), job.job_id)
        return JobResult(
            job.job_id,
            done == len(keys),
            successful_keys=tuple(keys[:done]) if 0 < done < len(keys) else None,
            transfer_bytes=done * self.block_size_bytes,
        )

    def _expect(self, stream: StreamSpec, key: OffloadKey) -> Expect:
        return stream.expect((self.layout.values,), self.layout.tokens(key), self.layout.dtype)


__all__ = ["ChunkLayout", "TierKVSecondaryTier", "TierSettings", "chunk_namespace"]
