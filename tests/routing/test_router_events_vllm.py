"""Cold-tier KV events reach vllm-router over vLLM's own ZMQ stream (real processes on loopback).

The router's choice shows the credit: replica B holds the first two blocks of a prompt in its GPU
cache, replica A only in the vault (other prompts evicted it from A's small GPU cache; vLLM announces
that block by block, and the router keeps A's cold entries). ``kv_aware`` credits a vault block at 0.3 of
a GPU block, so nine cold blocks on A (2.7) outweigh two GPU blocks on B (2.0) and the request goes to
A; without A's cold events it would go to B. After the blocks leave the vault, the connector's audit
announces their removal and the same setup goes to B.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.routing.conftest import MODEL, prompt
from tierkv.client.vault import VaultClient
from tierkv.routing.cluster import LocalCluster, ReplicaSpec, complete, connector_total, post, routed
from tierkv.routing.pages import PREVIEW, replay, replica_pages

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

FULL, SHORT = 300, 70  # about eleven blocks of 32 tokens; two blocks and a bit
FILLERS = 4  # prompts of FULL tokens that fill GPU_BLOCKS


def only_cold_on_a(cluster: LocalCluster, seed: int) -> str:
    """The prompt stored by A then evicted from A's GPU cache, its first blocks on B's GPU; A's output."""
    (a, _), (b, _) = cluster.replicas
    text = prompt(seed, FULL)
    before = connector_total(a.url, "kv_events")
    expected = complete(a.url, MODEL, text)
    for filler in range(FILLERS):  # evict the prompt from A's GPU cache (vLLM's LRU)
        complete(a.url, MODEL, prompt(1000 * seed + filler, FULL))
    complete(b.url, MODEL, prompt(seed, SHORT))
    assert connector_total(a.url, "kv_events") > before, "A announced nothing for its stored blocks"
    return expected


def announced_in_vault(replica: ReplicaSpec) -> list[list[int]]:
    """The first tokens of every prefix the replica's published events say is in the vaults."""
    return [list(p.preview) for p in replica_pages("a", replay(replica.replay)) if p.where == "vault"]


def tick(base: str) -> None:
    """One engine step on a replica (a prompt shorter than a block: no cache entry), so the events
    queued since its last step are published."""
    complete(base, MODEL, "t5 t6 t7", max_tokens=1)


def route(cluster: LocalCluster, text: str) -> tuple[str, str]:
    """Send ``text`` through the router: the worker it chose, and the output."""
    assert cluster.router is not None
    router = cluster.router[0]
    before = routed(router)
    out = complete(router.url, MODEL, text)
    after = routed(router)
    (chosen,) = [w for w in after if after[w] != before.get(w, 0)]
    return chosen, out


def test_a_prefix_only_the_vault_holds_is_credited_until_it_leaves_the_vault(cluster: LocalCluster) -> None:
    (a, _), (b, _) = cluster.replicas
    expected = only_cold_on_a(cluster, 21)
    restored = connector_total(a.url, "restored_blocks")
    chosen, out = route(cluster, prompt(21, FULL))
    assert chosen == a.url, "the router did not credit A's cold blocks"
    assert out == expected
    assert connector_total(a.url, "restored_blocks") >= restored + 9

    only_cold_on_a(cluster, 22)
    head = post(f"{a.url}/tokenize", {"model": MODEL, "prompt": prompt(22, FULL)})["tokens"][:PREVIEW]
    assert head in announced_in_vault(a), "A's stored blocks were not announced"
    with VaultClient(cluster.vaults[0].address) as client:
        assert client.flush(all_namespaces=True) > 0
    deadline = time.monotonic() + 60
    # The audit queues the removals; A's next engine step publishes them.
    while head in announced_in_vault(a):
        assert time.monotonic() < deadline, "no removal announced after the vault lost the blocks"
        time.sleep(1)
        tick(a.url)
    chosen, _ = route(cluster, prompt(22, FULL))
    assert chosen == b.url, "the router still credits blocks that left the vault"
