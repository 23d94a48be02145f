"""A hybrid model (gated delta-net linear attention + full attention) in a real vLLM engine on CPU.

vLLM's hybrid allocator gives the model two KV-cache groups: attention KV blocks, stored to the
``kv_cold`` vault, and recurrent-state pages, which vLLM offers at block boundaries (``align`` mode) and
the connector stores to the ``ssm_cold`` vault. A restore must bring both back, or claim nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.connectors.vllm.engine import (
    generate_counted,
    keys_in,
    make_llm,
    prompt,
    scheduler_connector,
    shutdown,
    store_then_forget,
    write_tiny_qwen3_next,
)
from tierkv.client.vault import VaultClient
from tierkv.connectors.vllm.plan import KV, STATE
from tierkv.vault.launcher import VaultProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPT = prompt(7, 700)


@pytest.fixture(scope="module")
def vaults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VaultProcess]]:
    root = tmp_path_factory.mktemp("hybrid-vaults")
    procs = {
        role: VaultProcess(root / role, role=role, max_bytes="256MiB").start()
        for role in ("kv_cold", "ssm_cold")
    }
    yield procs
    for proc in procs.values():
        proc.stop(timeout=10)


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory, vaults: dict[str, VaultProcess]) -> Iterator[Any]:
    model = write_tiny_qwen3_next(tmp_path_factory.mktemp("qwen3-next"))
    extra = {"kv_cold": vaults["kv_cold"].address, "ssm_cold": vaults["ssm_cold"].address}
    engine = make_llm(
        model,
        extra,
        max_model_len=2048,
        dtype="bfloat16",
        block_size=None,
        mamba_cache_mode="align",
        enable_prefix_caching=True,
    )
    yield engine
    shutdown(engine)


def test_kv_and_recurrent_state_are_restored_together(llm: Any, vaults: dict[str, VaultProcess]) -> None:
    topology = scheduler_connector(llm).topology
    assert topology.restorable, topology.unsupported
    assert {g.kind for g in topology.groups} == {KV, STATE}
    block = topology.block_size
    assert len(PROMPT) > block

    first, _ = store_then_forget(llm, PROMPT)
    assert keys_in(vaults["kv_cold"]) >= 1
    assert keys_in(vaults["ssm_cold"]) >= 1, "the state at the block boundary goes to ssm_cold"

    second, seen = generate_counted(llm, PROMPT)
    assert seen["lookup_hit_tokens"] == block
    assert seen["restored_blocks"] == 2, "one KV block and one state page"
    assert seen.get("load_errors", 0) == 0
    assert second[0] == first[0]
    assert second[1] == pytest.approx(first[1], abs=1e-5)


def test_no_state_in_the_vault_means_no_claim(llm: Any, vaults: dict[str, VaultProcess]) -> None:
    first, _ = generate_counted(llm, PROMPT)
    with VaultClient(vaults["ssm_cold"].address) as client:
        client.flush(all_namespaces=True)
    assert llm.reset_prefix_cache()
    assert keys_in(vaults["kv_cold"]) >= 1

    second, seen = generate_counted(llm, PROMPT)
    assert seen.get("lookup_hit_tokens", 0) == 0, "KV alone must not be claimed"
    assert seen.get("restored_blocks", 0) == 0
    assert second[0] == first[0]
