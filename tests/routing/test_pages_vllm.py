"""``tierkv pages`` against the running cluster: a prompt served by one replica is listed on that
replica's GPU, and in the vault once its connector stored it (the replica's announcement and the
vault's own chains)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.routing.conftest import MODEL, token_prompt
from tierkv.routing.cluster import LocalCluster, complete, connector_total

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


def pages(cluster: LocalCluster, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "tierkv", "pages", "--json"]
    for i, (spec, _) in enumerate(cluster.replicas):
        args += ["--replica", f"r{i}={spec.replay}"]
    for vault in cluster.vaults:
        args += ["--vault", vault.address]
    return subprocess.run([*args, *extra], capture_output=True, text=True, timeout=120, check=False)


def test_pages_lists_a_prefix_on_the_replica_that_served_it_and_in_the_vault(cluster: LocalCluster) -> None:
    a = cluster.replicas[0][0]
    text = token_prompt(31, 300)
    stored = connector_total(a.url, "stored_blocks")
    complete(a.url, MODEL, text)
    deadline = time.monotonic() + 60
    while connector_total(a.url, "stored_blocks") < stored + 9:  # the store runs after the request
        assert time.monotonic() < deadline, "the prompt was not stored"
        time.sleep(0.5)
        complete(a.url, MODEL, "t5 t6 t7", max_tokens=1)  # a step: publishes the announcement, counters

    done = pages(cluster)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["pages"]
    mine = [p for p in found if p["preview"][:4] == text[:4]]
    where = {(p["where"], p["holder"]) for p in mine if p["tokens"] >= 9 * 32}
    listed = [(p["where"], p["holder"], p["tokens"], p["preview"][:4]) for p in found]
    assert ("gpu", "r0") in where, listed
    assert ("vault", "r0") in where
    assert not any(p["holder"] == "r1" for p in mine), "listed on a replica that never saw the prompt"
    vault = cluster.vaults[0].address
    assert any(p["holder"] == vault and p["blocks"] >= 9 for p in found), "the vault lists no chain"


def test_pages_reports_an_unreachable_replica_and_still_lists_the_rest(cluster: LocalCluster) -> None:
    from tierkv.routing.cluster import free_port

    done = pages(cluster, "--replica", f"gone=tcp://127.0.0.1:{free_port()}", "--timeout", "2")
    assert done.returncode == 1
    doc = json.loads(done.stdout)
    assert any("gone" in e or "127.0.0.1" in e for e in doc["errors"])
    assert doc["pages"], "the answering replicas and vaults were not listed"
