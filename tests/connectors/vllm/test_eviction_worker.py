"""The worker's side of store on eviction: held jobs are reported to the scheduler, never to vLLM."""

from __future__ import annotations

import time

from tests.connectors.vllm.test_worker_logic import (
    blackhole,
    kv_caches,
    kv_view,
    make_worker,
    refs,
    vault_address,
)
from tierkv.connectors.vllm.plan import StepJobs, StoreJob
from tierkv.connectors.vllm.worker import WorkerSide

__all__ = ["blackhole", "vault_address"]  # fixtures shared with the worker tests


def held_done(worker: WorkerSide, count: int) -> list[str]:
    done: list[str] = []
    deadline = time.monotonic() + 20
    while len(done) < count:
        assert time.monotonic() < deadline, f"held jobs not reported: {done}"
        done += worker.take_held_done()
        time.sleep(0.005)
    return done


def test_a_held_job_is_reported_through_the_worker_meta_only(vault_address: str) -> None:
    worker = make_worker(vault_address, {0: [kv_view(kv_caches())]})
    try:
        worker.submit(StepJobs(stores=[StoreJob("tierkv-evict-0", refs(0, [0, 1], [3, 4]), held=True)]))
        assert held_done(worker, 1) == ["tierkv-evict-0"]
        assert worker.finished({"tierkv-evict-0"}) == (set(), set(), set()), "vLLM never hears of it"
        totals = worker.counters.totals()
        assert totals["stored_blocks"] == 2 and totals["store_requests"] == 0
    finally:
        worker.shutdown()


def test_a_refused_held_job_is_reported_at_once(blackhole: str) -> None:
    worker = make_worker(
        blackhole, {0: [kv_view(kv_caches())]}, timeout=1.0, max_inflight_stores=1, max_queued_stores=0
    )
    try:
        worker.submit(StepJobs(stores=[StoreJob("tierkv-evict-0", refs(0, [0], [1]), held=True)]))
        worker.submit(StepJobs(stores=[StoreJob("tierkv-evict-1", refs(0, [0], [2]), held=True)]))
        assert worker.take_held_done() == ["tierkv-evict-1"], "refused: its blocks are released now"
        assert held_done(worker, 1) == ["tierkv-evict-0"], "a failed store is reported too"
    finally:
        worker.shutdown()
