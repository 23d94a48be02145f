"""Prompt layouts of vLLM requests (kv_transfer_params, kv_hints) → block metadata in the store jobs,
through the scheduler half, and from a store job to a real vault through the worker half (no vLLM here;
the real engine is in ``test_hints_vllm.py``)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import pickle
from typing import Any

import pytest

pytest.importorskip("hypothesis", reason="the vLLM environment runs only the -m vllm tests")

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import VaultFactory
from tests.connectors.vllm.test_worker_logic import kv_caches, kv_view, make_worker, refs, wait
from tierkv.client.vault import VaultClient
from tierkv.connectors.vllm import hints
from tierkv.connectors.vllm.hints import HINT_ACTION, RequestLayouts, raw_layout
from tierkv.connectors.vllm.plan import KV, GroupPlan, StepJobs, StoreJob, make_topology
from tierkv.connectors.vllm.scheduler import SchedulerSide
from tierkv.connectors.vllm.stats import Counters
from tierkv.retention import GENERATION, BlockMeta, Retention, as_chunks, block_meta
from tierkv.tiering import MemoryStorage

BS = 16
KEYS = [hashlib.sha256(f"block-{i}".encode()).digest() for i in range(8)]
LAYOUT = [{"tokens": [0, 20], "source": "axioms", "priority": 5}, {"tokens": [20, 40], "source": "tools"}]


@dataclasses.dataclass(frozen=True)
class Action:
    """The fields of vLLM 0.32's ``KvHintAction`` (a msgspec struct)."""

    action_id: str
    action_type: str
    action_version: str
    payload: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Envelope:
    """The fields of vLLM 0.32's ``KvHintsEnvelope``."""

    protocol_version: str
    message_id: str
    actions: list[Action]


@dataclasses.dataclass
class FakeRequest:
    """The fields of a vLLM request the scheduler half reads."""

    request_id: str
    num_tokens: int
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    kv_hints: Envelope | None = None
    all_token_ids: list[int] = dataclasses.field(default_factory=list)


def hinted(layout: object, *, action_type: str = HINT_ACTION, version: str = "1") -> Envelope:
    other = Action("a0", "vendor.pin", "1", {"blocks": [1]})
    return Envelope("1", "m1", [other, Action("a1", action_type, version, {"layout": layout})])


def test_the_layout_comes_from_kv_transfer_params_or_a_kv_hints_action() -> None:
    assert raw_layout(FakeRequest("r", 1, 1)) is None
    assert raw_layout(FakeRequest("r", 1, 1, kv_transfer_params={"do_remote_prefill": False})) is None
    assert raw_layout(FakeRequest("r", 1, 1, kv_transfer_params={"tierkv": {"layout": LAYOUT}})) == LAYOUT
    assert raw_layout(FakeRequest("r", 1, 1, kv_hints=hinted(LAYOUT))) == LAYOUT
    assert raw_layout(FakeRequest("r", 1, 1, kv_hints=hinted(LAYOUT, action_type="other"))) is None
    both = FakeRequest(
        "r", 1, 1, kv_transfer_params={"tierkv": {"layout": LAYOUT[:1]}}, kv_hints=hinted(LAYOUT)
    )
    assert raw_layout(both) == LAYOUT[:1], "kv_transfer_params wins"


@pytest.mark.parametrize(
    "request_",
    [
        FakeRequest("r", 1, 1, kv_transfer_params={"tierkv": [1]}),
        FakeRequest("r", 1, 1, kv_transfer_params={"tierkv": None}),
        FakeRequest("r", 1, 1, kv_transfer_params={"tierkv": {"layout": LAYOUT, "pin": True}}),
        FakeRequest("r", 1, 1, kv_transfer_params={"tierkv": {"layout": [{"tokens": [5, 1]}]}}),
        FakeRequest("r", 1, 1, kv_transfer_params={"tierkv": {"layout": "axioms"}}),
        FakeRequest("r", 1, 1, kv_hints=hinted(LAYOUT, version="2")),
        FakeRequest("r", 1, 1, kv_hints=hinted([{"chars": [0, 9], "source": "axioms"}])),
    ],
)
def test_a_malformed_layout_is_ignored_and_counted(request_: FakeRequest) -> None:
    counters = Counters()
    assert RequestLayouts(counters).chunks(request_) is None
    assert counters.totals()["layouts_rejected"] == 1 and counters.totals()["layouts"] == 0


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


CHUNK = st.fixed_dictionaries(
    {"tokens": st.tuples(st.integers(0, 64), st.integers(0, 64)).map(sorted)},
    optional={
        "source": st.sampled_from(["axioms", "tools", "docs"]),
        "priority": st.integers(1, 5),
        "durability": st.sampled_from(["ephemeral", "session", "persistent", "permanent"]),
        "protected": st.booleans(),
    },
)


@settings(max_examples=200, deadline=None)
@given(st.lists(CHUNK, max_size=6))
def test_every_valid_layout_is_taken_whichever_way_it_comes(layout: list[dict[str, object]]) -> None:
    """The other half of the fuzz below: were every layout rejected, that one would still pass."""
    counters = Counters()
    layouts = RequestLayouts(counters)
    expected = as_chunks(layout)
    for request in (
        FakeRequest("r", 1, 1, kv_transfer_params={"tierkv": {"layout": layout}}),
        FakeRequest("r", 1, 1, kv_hints=hinted(layout)),
    ):
        assert layouts.chunks(request) == expected
    assert counters.totals()["layouts"] == 2 and counters.totals()["layouts_rejected"] == 0


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_any_json_in_the_envelope_is_a_layout_or_ignored(value: object) -> None:
    counters = Counters()
    layouts = RequestLayouts(counters)
    for params in ({"tierkv": value}, {"tierkv": {"layout": value}}):
        got = layouts.chunks(FakeRequest("r", 1, 1, kv_transfer_params=params))
        assert got is None or isinstance(got, list)
    layouts.chunks(FakeRequest("r", 1, 1, kv_hints=hinted(value)))
    totals = counters.totals()
    assert totals["layouts"] + totals["layouts_rejected"] == 3


def test_rejections_are_logged_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    counters = Counters()
    layouts = RequestLayouts(counters)
    bad = FakeRequest("r", 1, 1, kv_transfer_params={"tierkv": {"layout": 7}})
    with caplog.at_level(logging.WARNING, logger=hints.__name__):
        for _ in range(50):
            layouts.chunks(bad)
    assert counters.totals()["layouts_rejected"] == 50
    assert len(caplog.records) == 1 and "prompt layout ignored" in caplog.records[0].getMessage()


def make_scheduler() -> SchedulerSide:
    topo = make_topology([GroupPlan(0, KV, BS, ("l0",))], [], BS)
    ns = hashlib.sha256(b"hints").digest()
    return SchedulerSide(topo, {topo.streams[0]: [ns]}, MemoryStorage, lambda r: KEYS[: r.num_tokens // BS])


def finish(scheduler: SchedulerSide, request: FakeRequest, *, track: bool = True) -> StoreJob:
    if track:
        scheduler.track(request)
    request.num_computed_tokens = request.num_tokens
    assert scheduler.finished(request, [[1, 2, 3, 4, 5, 6]])
    (job,) = scheduler.take_jobs({}).stores
    return job


@pytest.mark.parametrize("track", [True, False])
def test_store_jobs_carry_each_blocks_metadata_with_the_chain_as_parents(track: bool) -> None:
    scheduler = make_scheduler()
    request = FakeRequest("r", num_tokens=5 * BS + 3, num_prompt_tokens=40)
    request.kv_transfer_params = {"tierkv": {"layout": LAYOUT}}
    job = finish(scheduler, request, track=track)
    assert job.meta is not None and list(job.meta) == KEYS[:5]
    assert [m.source for m in job.meta.values()] == ["axioms", "axioms", "tools", GENERATION, GENERATION]
    assert job.meta[KEYS[1]].protected and job.meta[KEYS[1]].importance == 1.0
    assert [m.parent for m in job.meta.values()] == [b"", *KEYS[:4]]
    assert scheduler.counters.totals()["layouts"] == 1
    scheduler.shutdown()


def test_a_request_without_a_layout_or_with_a_bad_one_is_stored_untagged() -> None:
    scheduler = make_scheduler()
    plain = finish(scheduler, FakeRequest("a", num_tokens=3 * BS, num_prompt_tokens=3 * BS))
    bad = FakeRequest("b", 3 * BS, 3 * BS, kv_transfer_params={"tierkv": {"layout": [{"tokens": 1}]}})
    rejected = finish(scheduler, bad)
    assert plain.meta is None and rejected.meta is None
    assert [r.key for r in rejected.refs] == KEYS[:3]
    assert scheduler.counters.totals()["layouts_rejected"] == 1
    scheduler.shutdown()


def test_warm_tokens_give_every_stored_block_its_token_ids_with_or_without_a_layout() -> None:
    topo = make_topology([GroupPlan(0, KV, BS, ("l0",))], [], BS)
    ns = hashlib.sha256(b"hints").digest()
    scheduler = SchedulerSide(
        topo,
        {topo.streams[0]: [ns]},
        MemoryStorage,
        lambda r: KEYS[: r.num_tokens // BS],
        retention=Retention(warm_tokens=True),
    )
    ids = list(range(100, 100 + 5 * BS))
    plain = finish(scheduler, FakeRequest("a", 3 * BS + 2, 3 * BS + 2, all_token_ids=ids[: 3 * BS + 2]))
    assert plain.meta is not None and list(plain.meta) == KEYS[:3]
    assert [m.tokens for m in plain.meta.values()] == [tuple(ids[i * BS : (i + 1) * BS]) for i in range(3)]
    assert [m.parent for m in plain.meta.values()] == [b"", *KEYS[:2]]
    assert not any(m.tagged for m in plain.meta.values())
    tagged = FakeRequest(
        "b", 5 * BS, 40, kv_transfer_params={"tierkv": {"layout": LAYOUT}}, all_token_ids=ids
    )
    job = finish(scheduler, tagged)
    assert job.meta is not None and job.meta[KEYS[0]].source == "axioms"
    assert job.meta[KEYS[2]].tokens == tuple(ids[2 * BS : 3 * BS])
    scheduler.shutdown()


def test_the_worker_ships_the_metadata_to_a_real_vault(vault_factory: VaultFactory) -> None:
    vault = vault_factory()
    worker = make_worker(vault.address, {0: [kv_view(kv_caches())]})
    try:
        blocks = refs(0, [0, 1, 2, 3], [3, 4, 5, 6])
        meta = block_meta(KEYS[:4], LAYOUT, BS, prompt_tokens=40)
        worker.submit(StepJobs(stores=[StoreJob("a", blocks[:3], meta=meta), StoreJob("b", blocks[3:])]))
        wait(worker, {"a", "b"}, sending=2)
    finally:
        worker.shutdown()
    with VaultClient(vault.address) as client:
        classes = {c.source: c.keys for c in client.stats().classes}
    assert classes == {"axioms": 2, "tools": 1, "": 1}, "job b carried no metadata: untagged"


def test_a_store_job_with_metadata_pickles_to_the_workers() -> None:
    job = StoreJob("r", refs(0, [0], [3]), meta={KEYS[0]: BlockMeta("rules", parent=b"p")})
    assert pickle.loads(pickle.dumps(job)).meta == job.meta
