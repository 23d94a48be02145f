"""A local cluster for the routing tests: two CPU vLLM replicas (tiny random-weight Llama) with
TierKVConnector on one shared vault, and vllm-router ``kv_aware`` reading their KV events through
loopback forwarders. Session-scoped (the routing tests share it): start-up takes a minute or more on
two cores. Skips when vLLM or vllm-router is not installed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

MODEL = "tiny"
GPU_BLOCKS = 40
"""Each replica's GPU KV cache in blocks of 32 tokens: a few prompts of ~360 tokens evict older ones."""


def token_prompt(seed: int, length: int) -> list[int]:
    """Deterministic pseudo-random token ids in [3, 1000)."""
    return [(seed * 7919 + i * 104729 + (i * i) % 97) % 997 + 3 for i in range(length)]


def prompt(seed: int, length: int) -> str:
    """A deterministic text prompt of ``length`` words of the tiny model's word tokenizer."""
    return " ".join(f"t{t}" for t in token_prompt(seed, length))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")
    from tests.connectors.vllm.engine import write_tiny_llama
    from tierkv.routing.cluster import LocalCluster, router_executable

    if router_executable() is None:
        pytest.skip("vllm-router is not installed (scripts/setup-vllm-env.sh installs vllm-router==0.1.17)")
    root = tmp_path_factory.mktemp("cluster")
    model = write_tiny_llama(root / "model")
    args = ("--dtype", "float32", "--enforce-eager", "--num-gpu-blocks-override", str(GPU_BLOCKS))
    with LocalCluster(
        root / "state", str(model), served_name=MODEL, replicas=2, vaults=1, replica_args=args
    ) as running:
        yield running
