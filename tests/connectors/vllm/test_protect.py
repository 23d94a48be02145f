"""Hot-tier protection against vLLM's real ``Scheduler`` and ``BlockPool`` (no model, no worker).

The scheduler is driven step by step the way the engine drives it; the worker side is played by the
test, which reports every finished request's store as done in the next step. Every check of held
blocks is made against vLLM's own accounting: ``ref_cnt`` of each block and the free-queue length.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from tests.connectors.vllm import test_scheduler_vllm as base
from tests.connectors.vllm.test_scheduler_vllm import BS, connector, kv_vault, model_dir, tokens
from tierkv.connectors.vllm.protect import Candidate, GpuProtector
from tierkv.connectors.vllm.stats import Counters
from tierkv.vault.launcher import VaultProcess

pytestmark = pytest.mark.vllm

__all__ = ["kv_vault", "model_dir"]  # fixtures shared with the scheduler tests

POOL = 64
SYSTEM_BLOCKS = 4


def make_scheduler(model: Path, address: str, **extra: Any) -> Scheduler:
    """vLLM's scheduler over a pool of POOL blocks, one attention group, the connector's ``extra``."""
    return base.make_scheduler(model, address, [base.attention(["l0"])], num_blocks=POOL, **extra)


def make_request(prompt: list[int], max_tokens: int = 2, protected: int = 0) -> Request:
    """A request whose first ``protected`` tokens are tagged ``axioms`` (a protected class)."""
    layout = [{"tokens": [0, protected], "source": "axioms"}]
    params = {"tierkv": {"layout": layout}} if protected else None
    return base.make_request(prompt, max_tokens, kv_transfer_params=params)


def agent_request(agent: int, turn: int, max_tokens: int = 2) -> Request:
    """Agent ``agent``'s protected system prompt (SYSTEM_BLOCKS blocks) and a user turn of its own."""
    prompt = tokens(SYSTEM_BLOCKS * BS, seed=agent) + tokens(BS + 5, seed=1000 + 10 * agent + turn)
    return make_request(prompt, max_tokens, protected=SYSTEM_BLOCKS * BS)


def pool(s: Scheduler) -> BlockPool:
    return s.kv_cache_manager.block_pool


def protector(s: Scheduler) -> GpuProtector:
    return connector(s)._protect


def step(s: Scheduler, check: bool = True) -> SchedulerOutput:
    """One engine step, the stores of requests finished before it reported done."""
    out = base.step(s, sending={rid for rid, r in s.requests.items() if r.is_finished()})
    if check:
        check_watermark(s)
    return out


def check_watermark(s: Scheduler) -> None:
    """After a step, free blocks are at the watermark or no idle held block is left."""
    p, prot = pool(s), protector(s)
    idle = [b for b in prot.held_ids() if p.blocks[b].ref_cnt == 1]
    assert p.get_num_free_blocks() >= prot.low_water or not idle, "idle held blocks kept under pressure"
    assert prot.held <= max(prot.cap, 0)


def run(s: Scheduler, requests: Iterable[Request], check: bool = True) -> list[Request]:
    """Add ``requests`` and step until vLLM has dropped all of them (lookups answer asynchronously)."""
    batch = list(requests)
    for r in batch:
        s.add_request(r)
    drain(s, batch, check)
    return batch


def drain(s: Scheduler, batch: list[Request], check: bool = True, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(r.request_id in s.requests for r in batch):
        assert time.monotonic() < deadline, "requests did not finish"
        step(s, check)
        time.sleep(0.002)
    step(s, check)  # stores of the last ones reported


def prefix_hit(s: Scheduler, request: Request) -> int:
    """Run ``request``; the prompt tokens its first scheduled step did not have to compute."""
    s.add_request(request)
    out = step(s)
    while request.request_id not in out.num_scheduled_tokens:
        out = step(s)
    drain(s, [request])
    return int(request.num_prompt_tokens - out.num_scheduled_tokens[request.request_id])


def system_blocks(s: Scheduler, agent: int) -> set[int]:
    """The agent's system-prompt blocks the GPU prefix cache still holds."""
    hashes = agent_request(agent, 0).block_hashes[:SYSTEM_BLOCKS]
    found = [pool(s).get_cached_block(h, [0]) for h in hashes]
    return {f[0].block_id for f in found if f is not None}


def system_cached(s: Scheduler, agent: int) -> int:
    return len(system_blocks(s, agent))


def pressure(s: Scheduler, seed: int, count: int = 4, blocks: int = 20) -> None:
    """Unrelated long prompts, one after the other: together they cycle through the whole pool."""
    for i in range(count):
        run(s, [make_request(tokens(blocks * BS, seed=seed + i))])


def assert_balanced(s: Scheduler) -> None:
    """No request and no hold left: vLLM's pool is back to all blocks free, every ref_cnt 0."""
    p = pool(s)
    assert not s.requests
    assert p.get_num_free_blocks() == POOL - 1, "the null block is the only one in use"
    assert all(b.ref_cnt == 0 for b in p.blocks if not b.is_null)


@pytest.mark.parametrize("fraction", [0.0, 0.2])
def test_protected_system_prompt_survives_pressure_that_evicts_it_otherwise(
    model_dir: Path, kv_vault: VaultProcess, fraction: float
) -> None:
    s = make_scheduler(model_dir, kv_vault.address, gpu_protect_fraction=fraction)
    run(s, [agent_request(1, 0)])
    assert system_cached(s, 1) == SYSTEM_BLOCKS
    pressure(s, seed=50)
    expected = SYSTEM_BLOCKS if fraction else 0
    assert system_cached(s, 1) == expected

    hit = prefix_hit(s, agent_request(1, 1))
    assert hit == expected * BS, "the next turn starts from the GPU prefix cache"
    totals = connector(s).totals()
    assert totals["gpu_protect_holds"] == expected
    assert totals["gpu_protect_holds"] - totals["gpu_protect_releases"] == protector(s).held


def burst() -> list[Request]:
    """Three requests of 12 prompt blocks that grow to 19 blocks each: 57 blocks together, more than
    the 51 that 12 held blocks leave of the 63 usable ones."""
    return [make_request(tokens(12 * BS, seed=70 + i), max_tokens=200) for i in range(3)]


@pytest.mark.parametrize(("watermark", "low_water"), [(0.1, 7), (0.0, 0)])
def test_cap_holds_and_pressure_releases_before_anything_is_preempted(
    model_dir: Path, kv_vault: VaultProcess, watermark: float, low_water: int
) -> None:
    """With the watermark, held blocks go back step by step; without it (0), when vLLM is about to
    preempt. Either way nothing is preempted."""
    s = make_scheduler(model_dir, kv_vault.address, gpu_protect_fraction=0.2, gpu_protect_watermark=watermark)
    prot = protector(s)
    assert (prot.cap, prot.low_water) == (12, low_water)
    for agent in range(5):  # 20 protected blocks offered, 12 may be held
        run(s, [agent_request(agent, 0)])
    assert prot.held == prot.cap
    newest = set().union(*(system_blocks(s, a) for a in (2, 3, 4)))
    assert prot.held_ids() == newest, "the newest chains are held"

    load = run(s, burst())
    assert sum(r.num_preemptions for r in load) == 0
    assert all(r.status == RequestStatus.FINISHED_LENGTH_CAPPED for r in load)
    totals = connector(s).totals()
    assert totals["gpu_protect_pressure_releases"] > 0
    assert totals["gpu_protect_holds"] - totals["gpu_protect_releases"] == prot.held < prot.cap
    s.shutdown()
    assert_balanced(s)


def test_without_releases_the_same_burst_preempts(
    model_dir: Path, kv_vault: VaultProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the test above: its load does preempt when held blocks are never released."""
    s = make_scheduler(model_dir, kv_vault.address, gpu_protect_fraction=0.2, gpu_protect_watermark=0.1)
    for agent in range(5):
        run(s, [agent_request(agent, 0)])
    monkeypatch.setattr(GpuProtector, "relieve", lambda self: 0)
    monkeypatch.setattr(GpuProtector, "make_room", lambda self: False)
    load = run(s, burst(), check=False)
    assert sum(r.num_preemptions for r in load) > 0


def test_shared_held_blocks_balance_through_reuse_reset_and_shutdown(
    model_dir: Path, kv_vault: VaultProcess
) -> None:
    s = make_scheduler(model_dir, kv_vault.address, gpu_protect_fraction=0.5)
    p, prot = pool(s), protector(s)
    run(s, [agent_request(1, 0)])
    held = prot.held_ids()
    assert len(held) == SYSTEM_BLOCKS and all(p.blocks[b].ref_cnt == 1 for b in held)
    assert p.get_num_free_blocks() == POOL - 1 - SYSTEM_BLOCKS, "held blocks left the free queue"

    reuse = agent_request(1, 1, max_tokens=3)
    s.add_request(reuse)
    while reuse.status != RequestStatus.RUNNING:
        step(s)
    assert all(p.blocks[b].ref_cnt == 2 for b in held), "the running request and tierkv"
    assert set(s.kv_cache_manager.get_block_ids(reuse.request_id)[0][:SYSTEM_BLOCKS]) == held
    drain(s, [reuse])
    assert prot.held_ids() == held and all(p.blocks[b].ref_cnt == 1 for b in held)
    assert connector(s).totals()["gpu_protect_holds"] == SYSTEM_BLOCKS, "a shared block is held once"

    assert s.reset_prefix_cache(), "a reset releases the holds instead of failing on them"
    assert prot.held == 0
    assert_balanced(s)

    run(s, [agent_request(2, 0)])
    assert prot.held == SYSTEM_BLOCKS
    s.shutdown()
    assert prot.held == 0
    assert_balanced(s)
    totals = connector(s).totals()
    assert totals["gpu_protect_holds"] == totals["gpu_protect_releases"] == 2 * SYSTEM_BLOCKS


def test_a_reset_refused_for_running_stores_keeps_the_protected_blocks(
    model_dir: Path, kv_vault: VaultProcess
) -> None:
    """Both features hold references in the pool behind one guard on its reset: store jobs that refuse
    it are asked before any protected block is let go."""
    s = make_scheduler(
        model_dir, kv_vault.address, gpu_protect_fraction=0.5, store="eviction", evict_lookahead=POOL
    )
    prot, eviction = protector(s), connector(s)._eviction
    run(s, [agent_request(1, 0)])
    assert eviction.pending, "the turn's unprotected cached blocks are being shipped"
    held = prot.held_ids()
    assert len(held) == SYSTEM_BLOCKS
    assert not s.reset_prefix_cache()
    assert prot.held_ids() == held, "a refused reset released protected blocks"
    eviction.done(dict.fromkeys(list(eviction._jobs), 1))
    assert s.reset_prefix_cache()
    assert prot.held == 0
    assert_balanced(s)


# -- the protector's bookkeeping on a bare BlockPool ---------------------------------------------------


def cached_blocks(p: BlockPool, n: int, seed: int) -> list[int]:
    """``n`` full blocks of a request's prompt, cached in ``p`` and still referenced by the request."""
    request = make_request(tokens(n * BS, seed=seed))
    blocks = p.get_new_blocks(n)
    p.cache_full_blocks(request, blocks, 0, n, BS, 0)
    return [b.block_id for b in blocks]


def finish(p: BlockPool, ids: list[int]) -> None:
    """The request lets go of its blocks (tail first, as vLLM frees them)."""
    p.free_blocks(p.blocks[b] for b in reversed(ids))


def offer(ids: list[int], importance: float = 1.0) -> list[Candidate]:
    return [Candidate(b, importance, d) for d, b in enumerate(ids)]


@pytest.fixture
def bare(model_dir: Path) -> tuple[BlockPool, GpuProtector, Counters]:
    p = BlockPool(20, enable_caching=True, hash_block_size=BS)
    counters = Counters()
    prot = GpuProtector(0.3, 0.25, counters)  # cap 6, low water 5
    prot.bind(p)
    return p, prot, counters


def test_release_order_is_importance_then_age_then_depth(
    bare: tuple[BlockPool, GpuProtector, Counters],
) -> None:
    p, prot, counters = bare
    old, new, low = cached_blocks(p, 2, 1), cached_blocks(p, 2, 2), cached_blocks(p, 2, 3)
    assert prot.protect(offer(old)) == 2 and prot.protect(offer(new)) == 2
    assert prot.protect(offer(low, importance=0.5)) == 2
    for ids in (old, new, low):
        finish(p, ids)
    assert prot.held == prot.cap == 6
    # 19 usable blocks, 6 held: 13 free. Take 10 so 3 are free, 2 under the low water of 5.
    taken = p.get_new_blocks(10)
    assert prot.relieve() == 2
    assert prot.held_ids() == {*old, *new}, "the less important chain goes first"
    p.free_blocks(p.get_new_blocks(3))  # nothing changes while free blocks are at the watermark
    assert prot.relieve() == 0
    more = p.get_new_blocks(2)
    assert prot.relieve() == 2 and prot.held_ids() == set(new), "then the older chain"
    more += p.get_new_blocks(1)
    assert prot.relieve() == 1 and prot.held_ids() == {new[0]}, "the chain's tail before its head"
    p.free_blocks(taken + more)
    assert counters.totals()["gpu_protect_pressure_releases"] == 5


def test_cap_displaces_lower_ranked_blocks_only(bare: tuple[BlockPool, GpuProtector, Counters]) -> None:
    p, prot, counters = bare
    a, b, c = cached_blocks(p, 3, 1), cached_blocks(p, 3, 2), cached_blocks(p, 3, 3)
    prot.protect(offer(a, 0.9))
    prot.protect(offer(b, 0.9))
    assert prot.protect(offer(c, 0.5)) == 0, "less important than everything held"
    assert prot.protect(offer(c, 0.9)) == 3, "as important and newer: displaces the oldest"
    assert prot.held_ids() == {*b, *c}
    assert all(p.blocks[x].ref_cnt == 1 for x in a), "displaced: back to the request's reference only"
    assert counters.totals()["gpu_protect_skipped"] == 3


def test_refresh_takes_no_second_reference_and_idle_blocks_go_first(
    bare: tuple[BlockPool, GpuProtector, Counters],
) -> None:
    p, prot, _ = bare
    a, b = cached_blocks(p, 2, 1), cached_blocks(p, 2, 2)
    prot.protect(offer(a))
    prot.protect(offer(b))
    assert prot.protect(offer(a)) == 0, "already held: refreshed, not referenced again"
    assert all(p.blocks[x].ref_cnt == 2 for x in a + b)
    finish(p, b)  # a is still in use by its request, b only held
    assert prot.make_room() and prot.held_ids() == set(a), "only blocks nobody else uses are freed"
    assert not prot.make_room()
    finish(p, a)
    prot.release_all()
    assert p.get_num_free_blocks() == 19 and all(x.ref_cnt == 0 for x in p.blocks if not x.is_null)


def test_nothing_is_held_under_the_watermark_or_without_a_hash(
    bare: tuple[BlockPool, GpuProtector, Counters],
) -> None:
    p, prot, counters = bare
    fresh = p.get_new_blocks(2)  # allocated, never cached: not in the prefix cache
    assert prot.protect(offer([b.block_id for b in fresh])) == 0
    assert prot.protect(offer([p.null_block.block_id])) == 0
    busy = p.get_new_blocks(12)
    a = cached_blocks(p, 2, 1)  # 3 free now, under the low water of 5
    assert prot.protect(offer(a)) == 0 and counters.totals()["gpu_protect_skipped"] == 2
    p.free_blocks(fresh + busy)
    finish(p, a)
    assert prot.held == 0
