"""Store on eviction against vLLM's real ``BlockPool`` (no model, no scheduler, no vault).

The walk, the references it takes and the reports that release them are checked against vLLM's own
accounting: each block's ``ref_cnt``, its prefix-cache hash and the free queue.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    make_block_hash_with_group_id,
)
from vllm.v1.request import Request

from tierkv.connectors.vllm.eviction import JOB_PREFIX, Bounded, EvictionStore
from tierkv.connectors.vllm.plan import KV, GroupPlan, Topology
from tierkv.connectors.vllm.pool import guard_reset
from tierkv.connectors.vllm.settings import ConnectorSettings
from tierkv.connectors.vllm.stats import Counters
from tierkv.errors import ConfigError
from tierkv.retention import BlockMeta

pytestmark = pytest.mark.vllm

BS = 16
POOL = 24
TOPOLOGY = Topology((GroupPlan(0, KV, BS, ("l0",)),), BS, BS)

init_none_hash(sha256)
_ids = iter(range(10**6))


def request(n_blocks: int, seed: int) -> Request:
    tokens = [(seed * 131 + i * 17) % 900 + 3 for i in range(n_blocks * BS)]
    return Request(
        request_id=f"r{next(_ids)}",
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BS, sha256),
    )


def keys_of(r: Request) -> list[bytes]:
    return [b"key-" + bytes(h)[:8] for h in r.block_hashes]


class Fixture:
    def __init__(self, lookahead: int = 4, workers: int = 1, remember: int = 1000) -> None:
        self.pool = BlockPool(POOL, enable_caching=True, hash_block_size=BS)
        self.counters = Counters()
        self.store = EvictionStore(TOPOLOGY, lookahead, remember, self.counters, workers=workers)
        self.store.bind(self.pool)
        guard_reset(self.pool, self.store.before_reset)

    def run(self, r: Request, meta: dict[bytes, BlockMeta] | None = None) -> list[int]:
        """``r`` computes its blocks (cached in the pool), finishes and frees them, tail first."""
        n = len(r.block_hashes)
        blocks = self.pool.get_new_blocks(n)
        self.pool.cache_full_blocks(r, blocks, 0, n, BS, 0)
        ids = [b.block_id for b in blocks]
        self.store.remember([ids], keys_of(r), meta, n * BS)
        self.pool.free_blocks(reversed(blocks))
        return ids

    def queue(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.iter_blocks_after(None)]

    def balanced(self) -> bool:
        return self.pool.get_num_free_blocks() == POOL - 1 and all(
            b.ref_cnt == 0 for b in self.pool.blocks[1:]
        )


def test_only_blocks_within_the_lookahead_are_shipped_then_held_until_reported() -> None:
    f = Fixture(lookahead=4)
    a = request(3, seed=1)
    ids = f.run(a, meta={keys_of(a)[0]: BlockMeta("axioms", 1.0, protected=True)})
    assert f.store.walk() == [], "19 uncached free blocks come first: nothing is near eviction"
    taken = f.pool.get_new_blocks(POOL - 1 - 3 - 2)  # two uncached blocks left before a's blocks
    (job,) = f.store.walk()
    assert job.held and job.req_id.startswith(JOB_PREFIX)
    assert [(r.position, r.block_id, r.key) for r in job.refs] == [
        (2, ids[2], keys_of(a)[2]),
        (1, ids[1], keys_of(a)[1]),
    ], "the window covers 4 free blocks: 2 uncached, then a's tail first (freed first)"
    assert job.meta is None, "the shipped blocks carry no metadata; block 0 had some"
    assert [f.pool.blocks[i].ref_cnt for i in ids] == [0, 1, 1]
    assert ids[1] not in f.queue() and ids[2] not in f.queue(), "held blocks cannot be handed out"
    (job0,) = f.store.walk()
    assert [r.position for r in job0.refs] == [0], "held blocks left the queue: the window moved on"
    assert job0.meta == {keys_of(a)[0]: BlockMeta("axioms", 1.0, protected=True)}, "metadata rides along"

    assert f.store.done({"someone-else": 1}) == 0
    assert f.store.done({job.req_id: 1}) == 2
    assert [f.pool.blocks[i].ref_cnt for i in ids] == [1, 0, 0]
    assert f.pool.blocks[ids[1]].block_hash is not None, "released blocks stay in the prefix cache"
    assert f.queue()[-2:] == [ids[2], ids[1]], "released blocks go back to the tail"
    assert f.store.walk() == [], "shipped blocks are not shipped twice"
    f.store.done({job0.req_id: 1})
    f.pool.free_blocks(taken)
    assert f.balanced()
    t = f.counters.totals()
    assert t["evict_store_blocks"] == t["evict_releases"] == 3


def test_a_step_that_changed_nothing_the_walk_reads_does_not_walk() -> None:
    f = Fixture(lookahead=POOL)
    walks = []
    iterate = f.pool.free_block_queue.iter_blocks_after
    f.pool.free_block_queue.iter_blocks_after = lambda c: walks.append(c) or iterate(c)  # type: ignore[method-assign]
    assert f.store.walk() == [] and len(walks) == 1
    assert f.store.walk() == [] and len(walks) == 1, "an idle step walks nothing"
    r = request(2, seed=9)
    blocks = f.pool.get_new_blocks(2)
    f.pool.cache_full_blocks(r, blocks, 0, 2, BS, 0)
    f.pool.free_blocks(blocks)  # the queue changed: its tail
    assert f.store.walk() == [] and len(walks) == 2, "blocks no request was seen finishing"
    f.store.remember([[b.block_id for b in blocks]], keys_of(r), None, 2 * BS)  # the keys became known
    (job,) = f.store.walk()
    assert len(walks) == 3 and len(job.refs) == 2
    assert f.store.walk() == [] and len(walks) == 4, "shipping changed the queue: one more (empty) walk"
    assert f.store.walk() == [] and len(walks) == 4


def test_a_job_is_released_once_every_worker_reported_it() -> None:
    f = Fixture(lookahead=POOL, workers=2)
    f.run(request(2, seed=2))
    (job,) = f.store.walk()
    assert f.store.done({job.req_id: 1}) == 0 and f.store.held == 2
    assert f.store.done({job.req_id: 1}) == 2 and f.store.held == 0
    assert f.balanced()


def test_blocks_with_no_known_key_are_counted_not_shipped() -> None:
    f = Fixture(lookahead=POOL)
    r = request(2, seed=3)
    blocks = f.pool.get_new_blocks(2)
    f.pool.cache_full_blocks(r, blocks, 0, 2, BS, 0)
    f.pool.free_blocks(blocks)  # a request the connector never saw finish
    assert f.store.walk() == []
    assert f.counters.totals()["evict_unknown_blocks"] == 2


def test_a_reset_waits_for_running_jobs_and_shutdown_releases_everything() -> None:
    f = Fixture(lookahead=POOL)
    f.run(request(3, seed=4))
    (job,) = f.store.walk()
    assert not f.pool.reset_prefix_cache(), "refused while blocks are being stored"
    assert f.store.release_all() == 3 and f.balanced()
    assert f.pool.reset_prefix_cache()
    f.store.done({job.req_id: 1})  # a late report of a released job changes nothing
    assert f.balanced()


def test_a_preempted_request_ships_its_still_cached_free_blocks_at_once() -> None:
    f = Fixture(lookahead=1)
    r = request(4, seed=5)
    blocks = f.pool.get_new_blocks(4)
    f.pool.cache_full_blocks(r, blocks, 0, 4, BS, 0)
    ids = [b.block_id for b in blocks]
    f.pool.free_blocks(reversed(blocks))  # preempted: its blocks go back, still cached
    f.pool.touch([blocks[0]])  # another request hits block 0: in use, not shipped
    taken = f.pool.get_new_blocks(POOL - 1 - 3)  # ... and the pool hands out block 3 already
    assert f.pool.blocks[ids[3]].block_hash is None
    jobs = f.store.preempted(r.block_hashes, keys_of(r), None, make_block_hash_with_group_id)
    assert [(ref.position, ref.block_id) for ref in jobs[0].refs] == [(1, ids[1]), (2, ids[2])]
    assert f.counters.totals()["evict_preempt_blocks"] == 2
    f.store.done({jobs[0].req_id: 1})
    f.pool.free_blocks([blocks[0]])
    assert f.store.walk() == [], "the head (block 1 of r) was shipped; block 0 is known but not near eviction"
    f.pool.free_blocks(taken)
    assert f.balanced()


def test_memory_is_bounded_and_forgets_the_oldest_first() -> None:
    b = Bounded(2)
    for k in (b"a", b"b", b"a", b"c"):
        b.put(k, True)
    assert list(b) == [b"a", b"c"]
    f = Fixture(lookahead=POOL, remember=1)
    f.run(request(3, seed=6))
    (job,) = f.store.walk()
    assert len(job.refs) == 1, "only the last remembered block has a key"


@pytest.mark.parametrize(("key", "bad"), [("store", "never"), ("evict_lookahead", -1), ("evict_remember", 0)])
def test_eviction_settings_are_checked(key: str, bad: object) -> None:
    settings = ConnectorSettings.from_extra({"kv_cold": "127.0.0.1:1"})
    assert (settings.store, settings.evict_lookahead) == ("finish", 0), "store on finish unless asked"
    assert ConnectorSettings.from_extra({"kv_cold": "127.0.0.1:1", "store": "eviction"}).store == "eviction"
    with pytest.raises(ConfigError, match=key):
        ConnectorSettings.from_extra({"kv_cold": "127.0.0.1:1", key: bad})


def test_worker_reports_add_up_across_workers_and_keep_the_event_reports() -> None:
    from tierkv.connectors.vllm.connector import TierKVWorkerReport
    from tierkv.connectors.vllm.events import TierKVWorkerMeta

    a = TierKVWorkerReport({"tierkv-evict-0": 1, "tierkv-evict-1": 1}, TierKVWorkerMeta({"r": [b"k1"]}))
    b = TierKVWorkerReport({"tierkv-evict-0": 1}, TierKVWorkerMeta({"r": [b"k2"]}, [b"gone"]))
    merged = a.aggregate(b)
    assert isinstance(merged, TierKVWorkerReport)
    assert merged.jobs == {"tierkv-evict-0": 2, "tierkv-evict-1": 1}
    assert isinstance(merged.events, TierKVWorkerMeta)
    assert merged.events.stored == {"r": [b"k1", b"k2"]} and merged.events.gone == [b"gone"]
    assert TierKVWorkerReport({"j": 1}).aggregate(TierKVWorkerReport({}, b.events)).events is b.events
