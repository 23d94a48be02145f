"""The local cluster of ``tierkv demo --cluster`` (two replicas, two vaults, vllm-router kv_aware):
requests sharing a prefix meet on one replica, and losing a vault or a replica leaves the router and
the other parts serving the same greedy output. Its own cluster: the outages below break it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.routing.conftest import GPU_BLOCKS, MODEL, prompt
from tierkv.routing.cluster import LocalCluster, complete, reset_prefix_cache, routed, router_executable
from tierkv.routing.demo import Turn, send_trace

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

PROMPTS = [prompt(50 + i, 200 + 40 * i) for i in range(3)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if router_executable() is None:
        pytest.skip("vllm-router is not installed (scripts/setup-vllm-env.sh installs vllm-router==0.1.17)")
    from tests.connectors.vllm.engine import write_tiny_llama

    root = tmp_path_factory.mktemp("outage")
    model = write_tiny_llama(root / "model")
    args = ("--dtype", "float32", "--enforce-eager", "--num-gpu-blocks-override", str(GPU_BLOCKS))
    debug = ("--log-level", "debug")  # the router logs each decision's credited tokens at debug level
    with LocalCluster(
        root / "state", str(model), served_name=MODEL, vaults=2, replica_args=args, router_args=debug
    ) as running:
        yield running


@pytest.fixture(scope="module")
def expected(cluster: LocalCluster) -> list[str]:
    """Greedy outputs of PROMPTS with every part up (computed by one replica, nothing cached)."""
    a = cluster.replicas[0][0]
    return [complete(a.url, MODEL, p) for p in PROMPTS]


def test_two_requests_sharing_a_prefix_go_to_the_same_replica(cluster: LocalCluster) -> None:
    """The first request is sent to replica1 directly (the router breaks ties towards replica0), so
    only the shared prefix can send the second one there too."""
    b = cluster.replicas[1][0]
    system = prompt(7, 160)
    complete(b.url, MODEL, f"{system} {prompt(8, 20)}")
    (second,) = send_trace(cluster, iter([Turn("agent", 0, 1, f"{system} {prompt(9, 20)}")]))
    assert second.replica == "replica1"
    assert second.credited >= 128, "the router gave no reason for its choice"


def test_a_vault_going_down_leaves_the_cluster_serving_correct_output(
    cluster: LocalCluster, expected: list[str]
) -> None:
    assert cluster.router is not None
    router = cluster.router[0]
    assert [complete(router.url, MODEL, p) for p in PROMPTS] == expected  # stored across both vaults
    for spec, _ in cluster.replicas:
        reset_prefix_cache(spec.url)
    cluster.vaults[1].stop()
    assert [complete(router.url, MODEL, p) for p in PROMPTS] == expected


def test_a_replica_going_down_leaves_the_router_and_the_other_replica_serving(
    cluster: LocalCluster, expected: list[str]
) -> None:
    assert cluster.router is not None
    router = cluster.router[0]
    (a, _), (_, b_process) = cluster.replicas
    b_process.stop()
    before = routed(router)
    outputs = [complete(router.url, MODEL, p) for p in PROMPTS * 2]
    assert outputs == expected * 2
    after = routed(router)
    assert after[a.url] - before.get(a.url, 0) == len(outputs), "requests were not all served by replica0"
