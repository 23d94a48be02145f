"""The connector's scheduler half against a real vault process, without vLLM.

The engine-level contract is covered with vLLM's real ``Scheduler`` in ``test_scheduler_vllm.py``; here
the half is driven directly, for the paths that engine cannot be steered into on demand.
"""

from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import dataclass

import pytest

from tests.connectors.vllm.clock import StepClock
from tierkv.client.cluster import Cluster
from tierkv.connectors.vllm.plan import KV, GroupPlan, make_topology
from tierkv.connectors.vllm.scheduler import SchedulerSide
from tierkv.vault.launcher import VaultProcess

BS = 16
KEYS = [hashlib.sha256(f"block-{i}".encode()).digest() for i in range(8)]
NAMESPACE = hashlib.sha256(b"scheduler-logic").digest()


@dataclass
class FakeRequest:
    """The fields of a vLLM request the scheduler half reads."""

    request_id: str
    num_tokens: int
    num_computed_tokens: int = 0


CALL_TIMEOUT_S = 10.0
"""The vault calls' deadline where an answer is expected: these tests are about what the scheduler does
with the answers, and a busy machine (tests in parallel, other work) must make them slow, not fail."""


def make_scheduler(address: str, **options: object) -> SchedulerSide:
    topo = make_topology([GroupPlan(0, KV, BS, ("l0",))], [], BS)
    return SchedulerSide(
        topo,
        {topo.streams[0]: [NAMESPACE]},
        lambda: Cluster({"kv_cold": address}, timeout=CALL_TIMEOUT_S),
        lambda request: KEYS[: request.num_tokens // BS],
        **options,  # type: ignore[arg-type]
    )


def matched(scheduler: SchedulerSide, request: FakeRequest, local: int = 0) -> tuple[int | None, bool]:
    """Ask, with ``local`` tokens already in vLLM's own cache, until the asynchronous lookup has answered."""
    deadline = time.monotonic() + 20
    while (answer := scheduler.matched_tokens(request, local))[0] is None:
        assert time.monotonic() < deadline, "lookup never answered"
        time.sleep(0.005)
    return answer


def test_broken_sync_load_does_not_block_the_later_store(vault: VaultProcess) -> None:
    with Cluster({"kv_cold": vault.address}, timeout=CALL_TIMEOUT_S) as cluster:
        assert cluster.put(NAMESPACE, {k: b"blob" for k in KEYS[:4]}).stored == 4
    scheduler = make_scheduler(vault.address, sync_loads=True)
    try:
        request = FakeRequest("r", num_tokens=4 * BS + 3)
        assert matched(scheduler, request) == (4 * BS, False), "sync loads are not asynchronous"
        scheduler.after_alloc(request, [[5, 0, 7, 8]], 4 * BS)  # vLLM's null block where one was needed
        (load,) = scheduler.take_jobs({}).loads
        assert load.broken and load.sync
        assert [r.block_id for r in load.refs] == [5, 0, 7, 8]

        request.num_computed_tokens = request.num_tokens
        assert scheduler.finished(request, [[5, 6, 7, 8, 9]]), "the recomputed blocks are stored"
        (store,) = scheduler.take_jobs({}).stores
        assert [r.block_id for r in store.refs] == [5, 6, 7, 8]
    finally:
        scheduler.shutdown()


def test_request_finished_while_loading_asynchronously_is_not_stored(vault: VaultProcess) -> None:
    with Cluster({"kv_cold": vault.address}, timeout=CALL_TIMEOUT_S) as cluster:
        assert cluster.put(NAMESPACE, {k: b"blob" for k in KEYS[:2]}).stored == 2
    scheduler = make_scheduler(vault.address)
    try:
        request = FakeRequest("r", num_tokens=3 * BS)
        assert matched(scheduler, request) == (2 * BS, True)
        scheduler.after_alloc(request, [[3, 4, 5]], 2 * BS)
        assert not scheduler.finished(request, [[3, 4, 5]])
        assert scheduler.take_jobs({}).stores == []

        scheduler.transfers_done(set(), {"r"})
        again = FakeRequest("r", num_tokens=3 * BS, num_computed_tokens=3 * BS)
        assert scheduler.finished(again, [[3, 4, 5]]), "once the load is reported the request stores"
    finally:
        scheduler.shutdown()


class GoneRecorder:
    """Stands in for the connector's event book (which needs vLLM): records the keys reported gone."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []

    def gone(self, keys: list[bytes]) -> None:
        self.keys.extend(keys)


def test_a_lookup_that_stops_short_reports_the_first_missing_block_gone(vault: VaultProcess) -> None:
    with Cluster({"kv_cold": vault.address}, timeout=CALL_TIMEOUT_S) as cluster:
        assert cluster.put(NAMESPACE, {k: b"blob" for k in KEYS[:5] if k != KEYS[3]}).stored == 4
    events = GoneRecorder()
    scheduler = make_scheduler(vault.address, events=events)
    try:
        assert matched(scheduler, FakeRequest("r", num_tokens=6 * BS + 1)) == (3 * BS, True)
        assert events.keys == [KEYS[3]]
    finally:
        scheduler.shutdown()


def put_blocks(address: str, keys: list[bytes]) -> None:
    with Cluster({"kv_cold": address}, timeout=CALL_TIMEOUT_S) as cluster:
        assert cluster.put(NAMESPACE, dict.fromkeys(keys, b"blob")).stored == len(keys)


def arrived(scheduler: SchedulerSide, num_tokens: int) -> FakeRequest:
    """A request vLLM has just added, once the lookup it started on arrival has run."""
    request = FakeRequest("r", num_tokens=num_tokens)
    scheduler.track(request)
    deadline = time.monotonic() + 20
    while scheduler.counters.totals()["lookups"] < 1:
        assert time.monotonic() < deadline, "the lookup on arrival never ran"
        time.sleep(0.005)
    return request


def test_a_prompt_is_looked_up_on_arrival_and_vllm_is_answered_from_that_lookup(vault: VaultProcess) -> None:
    put_blocks(vault.address, KEYS[:5])
    scheduler = make_scheduler(
        vault.address, lookup_lease_ms=2000, clock=StepClock()
    )  # the lease stays young
    try:
        request = arrived(scheduler, 6 * BS + 1)
        # vLLM's own cache holds the first 2 blocks: the lookup of the whole prompt answers for the rest
        assert matched(scheduler, request, 2 * BS) == (3 * BS, True)
        assert scheduler.counters.totals()["lookups"] == 1, "no second lookup"
        scheduler.after_alloc(request, [[10, 11, 12, 13, 14, 15]], 3 * BS)
        (load,) = scheduler.take_jobs({}).loads
        assert [(r.position, r.block_id, r.key) for r in load.refs] == [
            (p, 10 + p, KEYS[p]) for p in range(2, 5)
        ]
    finally:
        scheduler.shutdown()


def test_a_lookup_on_arrival_that_says_nothing_past_the_local_hit_is_asked_again(vault: VaultProcess) -> None:
    """The vaults miss block 1, which vLLM holds: the leading run from block 0 ends before the blocks that
    matter, so those are looked up on their own."""
    put_blocks(vault.address, [KEYS[0], *KEYS[2:5]])
    scheduler = make_scheduler(vault.address)
    try:
        request = arrived(scheduler, 6 * BS + 1)
        assert matched(scheduler, request, 2 * BS) == (3 * BS, True)
        assert scheduler.counters.totals()["lookups"] == 2
    finally:
        scheduler.shutdown()


def test_a_lookup_on_arrival_older_than_half_its_lease_is_not_trusted(vault: VaultProcess) -> None:
    put_blocks(vault.address, KEYS[:3])
    clock = StepClock()
    scheduler = make_scheduler(vault.address, lookup_lease_ms=100, clock=clock)
    try:
        request = arrived(scheduler, 6 * BS + 1)
        clock.advance(0.06)  # past half the lease: the vaults may drop the blocks before the load
        assert matched(scheduler, request, BS) == (2 * BS, True)
        assert scheduler.counters.totals()["lookups"] == 2
    finally:
        scheduler.shutdown()


@pytest.mark.parametrize(("on_arrival", "lookups"), [(True, 2), (False, 1)])
def test_no_lookup_on_arrival_when_switched_off(vault: VaultProcess, on_arrival: bool, lookups: int) -> None:
    """The vaults hold nothing and vLLM one block: on arrival the prompt is looked up from block 0, which
    says nothing past the local hit, so vLLM's question is a second lookup; switched off, the only one."""
    scheduler = make_scheduler(vault.address, lookup_on_arrival=on_arrival)
    try:
        request = FakeRequest("r", num_tokens=6 * BS + 1)
        scheduler.track(request)
        assert matched(scheduler, request, BS) == (0, False)
    finally:
        scheduler.shutdown()  # waits for every lookup it started
    assert scheduler.counters.totals()["lookups"] == lookups


def test_a_slow_lookup_delays_one_step_not_every_step() -> None:
    """A vault that accepts and never answers: the first step waits its budget for the lookup, later
    steps ask and move on (the wait is recorded once)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        topo = make_topology([GroupPlan(0, KV, BS, ("l0",))], [], BS)
        scheduler = SchedulerSide(
            topo,
            {topo.streams[0]: [NAMESPACE]},
            lambda: Cluster({"kv_cold": address}, timeout=1.0),
            lambda request: KEYS[: request.num_tokens // BS],
            lookup_wait_s=0.05,
        )
        try:
            request = FakeRequest("r", num_tokens=6 * BS + 1)
            scheduler.track(request)
            waited = []
            for _ in range(3):
                assert scheduler.matched_tokens(request, 0) == (None, False)
                waited.append(scheduler.counters.totals()["lookup_wait_us"])
                scheduler.take_jobs({})  # the next step, with a fresh wait budget
            assert waited[0] >= 40_000, "the first step waited for the lookup"
            assert waited[1] == waited[2] == waited[0], "later steps did not wait again"
        finally:
            scheduler.shutdown()
