"""``store: "eviction"`` inside a real vLLM engine (CPU, tiny random Llama) against a real vault.

The GPU pool is shrunk (``num_gpu_blocks_override``) so that a handful of prompts evict each other;
steps are small (``max_num_batched_tokens``) so a block cannot go from "far from eviction" to "handed
out" within one step. The reference output of a prompt is the engine's own cold prefill of it, which
the connector's engine tests check against an engine without a connector.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.conftest import VaultFactory
from tests.connectors.vllm.engine import (
    connector_totals,
    delta,
    drain,
    generate,
    generate_counted,
    make_llm,
    prompt,
    scheduler_connector,
    shutdown,
    write_tiny_llama,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

POOL = 40
ENGINE = {"num_gpu_blocks_override": POOL, "max_model_len": 512, "max_num_batched_tokens": 128}
LOOKAHEAD = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def engine(model_dir: Path, address: str, store: str, namespace: str = "") -> Any:
    extra = {
        "kv_cold": address,
        "store": store,
        "evict_lookahead": LOOKAHEAD,
        "gpu_protect_fraction": 0.0,
        "namespace": namespace or store,
    }
    llm = make_llm(model_dir, extra, max_model_len=ENGINE["max_model_len"], **_rest())
    return llm


def _rest() -> dict[str, Any]:
    return {k: v for k, v in ENGINE.items() if k != "max_model_len"}


@pytest.fixture
def evicting(model_dir: Path, vault_factory: VaultFactory) -> Iterator[Any]:
    llm = engine(model_dir, vault_factory("kv").address, "eviction")
    yield llm
    shutdown(llm)


def pool(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool


def assert_balanced(llm: Any) -> None:
    """No block is referenced by anyone once every request finished and every store was reported."""
    drain(llm)
    conn = scheduler_connector(llm)
    assert conn._eviction.held == 0
    p = pool(llm)
    assert p.get_num_free_blocks() == p.num_gpu_blocks - 1, "a block is still referenced"
    totals = conn.totals()
    assert totals["evict_store_blocks"] == totals["evict_releases"]


def test_evicted_blocks_are_restored_with_identical_output(evicting: Any) -> None:
    target = prompt(1, 300)  # 9 full blocks
    reference, moved = generate_counted(evicting, target)
    assert moved.get("stored_blocks", 0) == 0, "a finished request ships nothing by itself"

    before = connector_totals(evicting)
    # 6 x 10 blocks through a pool of 39: the target's blocks are reused, even those that a finished
    # store sent back to the tail of the free queue
    for seed in range(10, 16):
        generate(evicting, [prompt(seed, 300)], max_tokens=2)
    drain(evicting)
    pushed = delta(before, connector_totals(evicting))
    assert pushed["evict_store_blocks"] >= 9 and pushed["stored_blocks"] >= 9
    assert pushed["evict_store_blocks"] == pushed["evict_releases"], "every reference was dropped"
    p = pool(evicting)
    assert p.get_num_free_blocks() == POOL - 1

    again, restored = generate_counted(evicting, target)
    assert restored["restored_blocks"] == 9, "the GPU lost the target's blocks; the vault had them"
    assert restored.get("load_errors", 0) == 0
    assert again[0] == reference[0]
    assert again[1] == pytest.approx(reference[1], abs=1e-4)
    assert_balanced(evicting)


def hot_workload(llm: Any) -> dict[str, int]:
    """Three shared prefixes, each asked four times with different tails, all staying on the GPU."""
    before = connector_totals(llm)
    for turn in range(4):
        for agent in range(3):
            generate(llm, [prompt(100 + agent, 96) + prompt(200 + 10 * agent + turn, 40)], max_tokens=4)
    drain(llm)
    return delta(before, connector_totals(llm))


def test_hot_reuse_ships_fewer_bytes_than_store_on_finish(
    model_dir: Path, vault_factory: VaultFactory
) -> None:
    vault = vault_factory("kv")
    moved: dict[str, dict[str, int]] = {}
    for store in ("finish", "eviction"):
        llm = engine(model_dir, vault.address, store)
        try:
            moved[store] = hot_workload(llm)
        finally:
            shutdown(llm)
    assert moved["finish"]["stored_bytes"] > 0
    assert moved["eviction"].get("stored_bytes", 0) < moved["finish"]["stored_bytes"]
    assert moved["finish"]["stored_blocks"] >= 3 * 4, "store on finish ships every prefix's blocks"


def test_references_balance_after_preemption_and_at_shutdown(
    model_dir: Path, vault_factory: VaultFactory
) -> None:
    llm = engine(model_dir, vault_factory("kv").address, "eviction")
    try:
        # Four long generations at once need more than the pool: vLLM preempts some of them.
        prompts = [prompt(300 + i, 200) for i in range(4)]
        before = connector_totals(llm)
        outs = generate(llm, prompts, max_tokens=160)  # the random model may stop early at its EOS
        assert len(outs) == 4
        assert_balanced(llm)
        moved = delta(before, connector_totals(llm))
        assert moved.get("evict_store_blocks", 0) > 0
        assert moved["evict_preempt_blocks"] > 0, "a preempted request's blocks are shipped at once"
        # More requests, not drained: a job still running at shutdown is released then.
        generate(llm, [prompt(400, 300)], max_tokens=2)
        generate(llm, [prompt(401, 300)], max_tokens=2)
        conn = scheduler_connector(llm)
    finally:
        shutdown(llm)
    assert conn._eviction.held == 0
    totals = conn.totals()
    assert totals["evict_store_blocks"] == totals["evict_releases"]
