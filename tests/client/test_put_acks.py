"""A put counts only what the vaults' replies said they stored: refusals surface in the result, the
metrics, the pipeline's tally, the hooks' counters and a rate-limited log line; a reply that does not add
up stores nothing; a stalled replica costs a hedge delay, not the whole deadline.

Real vault processes throughout; the only fake is a gRPC peer answering hand-built PutReply bytes (a real
vault never sends a reply that does not add up)."""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

from tests.client.test_garbage_peers import Answering, grpc_peer
from tests.conftest import VaultFactory, token_file_args
from tests.processes import stopped
from tierkv import VaultClient
from tierkv.client.cluster import Cluster
from tierkv.codec import LayerGroup
from tierkv.errors import VaultError
from tierkv.logs import Throttle
from tierkv.records import REFUSED, Rejection
from tierkv.tiering import ColdTier, NumpyArrays, StreamSpec
from tierkv.wire import pb

MiB = 1 << 20


def put_keys(cluster: Cluster, outcome: str) -> float:
    value = cluster.metrics.registry.get_sample_value(
        "tierkv_client_put_keys_total", {"role": "kv_cold", "outcome": outcome}
    )
    return value or 0.0


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "grpc"])
def test_a_blob_larger_than_the_vault_is_rejected_not_counted(
    vault_factory: VaultFactory, bulk: bool
) -> None:
    v = vault_factory(max_bytes="1MiB")
    big, small = os.urandom(2 * MiB), os.urandom(1000)
    with VaultClient(v.address, timeout=10, bulk=bulk) as c:
        assert c.put(b"ns", {b"big": big}) == 0
        ack = c.put_acks(b"ns", [(b"small", small), (b"big", big)])
        assert (ack.stored, ack.rejected) == ((0,), (1,))
    with Cluster({"kv_cold": [v.address]}, timeout=10, bulk=bulk) as cluster:
        result = cluster.put(b"ns", {b"big": big})
        assert (result.sent, result.stored, result.rejected, result.failed) == (1, 0, 1, 0)
        assert result.unstored == (b"big",)
        assert result.rejections == (Rejection(b"big", v.address, REFUSED),)
        assert cluster.get(b"ns", [b"big"]) == [None]
        mixed = cluster.put(b"ns", {b"a": small, b"big": big, b"c": small})
        assert (mixed.stored, mixed.rejected, mixed.unstored) == (2, 1, (b"big",))
        assert put_keys(cluster, "rejected") == 2 and put_keys(cluster, "stored") == 2


def test_a_tenant_quota_refusal_is_a_rejection(vault_factory: VaultFactory, tmp_path: Path) -> None:
    v = vault_factory(
        max_bytes="16MiB", extra_args=token_file_args(tmp_path, "tok-a alpha user 1MiB\ntok-b beta user\n")
    )
    blob = os.urandom(MiB + MiB // 2)
    with Cluster({"kv_cold": [v.address]}, timeout=10, token="tok-a") as alpha:
        assert alpha.put(b"ns", {b"k": blob}).rejected == 1
    with Cluster({"kv_cold": [v.address]}, timeout=10, token="tok-b") as beta:
        assert beta.put(b"ns", {b"k": blob}).stored == 1


def reply(**fields: object) -> bytes:
    return pb.PutReply(**fields).SerializeToString()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "answer",
    [
        reply(),  # an empty reply: nothing stored
        reply(stored=5),  # more than was sent
        reply(stored=1, rejected=1, rejected_index=[0]),  # one blob counted twice
        reply(rejected=1),  # a refusal without its position
        reply(rejected=1, rejected_index=[7]),  # a position past the batch
    ],
    ids=["empty", "too many", "twice", "no position", "out of range"],
)
def test_a_reply_that_does_not_add_up_counts_nothing(answer: bytes) -> None:
    for address in grpc_peer(Answering(answer))():
        with VaultClient(address, timeout=2.0, bulk=False) as c, pytest.raises(VaultError, match="malformed"):
            c.put(b"ns", {b"a": b"x"})
        with Cluster({"kv_cold": [address]}, timeout=2.0, bulk=False) as cluster:
            result = cluster.put(b"ns", {b"a": b"x"})
            assert (result.stored, result.failed, result.unstored) == (0, 1, (b"a",))


def test_a_reply_that_adds_up_is_taken_from_the_same_fake_peer() -> None:
    """The fake above is not refused for being a fake: a consistent reply counts."""
    for address in grpc_peer(Answering(reply(stored=1)))():
        with Cluster({"kv_cold": [address]}, timeout=2.0, bulk=False) as cluster:
            assert cluster.put(b"ns", {b"a": b"x"}).stored == 1


def test_refusals_are_logged_at_most_once_per_interval(
    vault_factory: VaultFactory, caplog: pytest.LogCaptureFixture
) -> None:
    v = vault_factory(max_bytes="1MiB")
    big = os.urandom(2 * MiB)
    with Cluster({"kv_cold": [v.address]}, timeout=10) as cluster, caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert cluster.put(b"ns", {b"big": big}).rejected == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "tierkv.client.cluster"]
    assert len(lines) == 1 and "1 blobs refused" in lines[0] and v.address in lines[0], lines


def test_the_throttle_sums_what_it_held_back() -> None:
    now = [100.0]
    throttle = Throttle(10.0, clock=lambda: now[0])
    assert throttle.add({"rejected": 1}) == ({"rejected": 1}, 0.0)
    assert throttle.add({"rejected": 2, "failed": 0}) is None
    now[0] += 4
    assert throttle.add({"failed": 1}) is None
    now[0] += 6
    due = throttle.add({"rejected": 1})
    assert due is not None and due[0] == {"rejected": 3, "failed": 1} and due[1] == 10.0
    assert throttle.add({}) is None


def test_the_pipeline_tally_counts_refused_blocks(vault_factory: VaultFactory) -> None:
    v = vault_factory(max_bytes="1MiB")
    arrays = NumpyArrays()
    rng = np.random.default_rng(0)
    small, big = (
        rng.standard_normal((4, 64), dtype=np.float32),
        rng.standard_normal((2, 300_000), dtype=np.float32),
    )
    spec = StreamSpec(b"n" * 32, LayerGroup.ATTENTION)
    with Cluster({"kv_cold": [v.address]}, timeout=10) as cluster:
        tier = ColdTier(cluster, arrays)
        tally = tier.store(spec, [(b"small", small, 16), (b"big", big, 16)])
    assert (tally.sent, tally.stored, tally.rejected, tally.failed, tally.acked) == (2, 1, 1, 1, [b"small"])
    assert tally.stored_bytes == len(arrays.encode(small, spec.codec, 16, spec.layer_group))


def test_a_stalled_replica_costs_a_hedge_delay_and_is_counted_lagging(vault_factory: VaultFactory) -> None:
    a, b = vault_factory(name="a"), vault_factory(name="b")
    blobs = {f"k{i}".encode(): os.urandom(10_000) for i in range(6)}
    deadline = 30.0
    with Cluster(
        {"kv_cold": [a.address, b.address]}, timeout=deadline, replication=2, hedge_after_s=0.2
    ) as cluster:
        assert cluster.put(b"ns", {b"warm": b"up"}).lagging == 0
        with stopped(b):
            start = time.monotonic()
            result = cluster.put(b"ns", blobs)
            took = time.monotonic() - start
            assert (result.stored, result.lagging, result.failed) == (6, 6, 0)
            assert took < deadline / 2, f"the put waited {took:.1f} s for the stalled replica"
            assert cluster.get(b"ns", list(blobs)) == list(blobs.values())
        assert put_keys(cluster, "lagging") == 6


def test_a_replica_that_refuses_leaves_a_lagging_copy(vault_factory: VaultFactory) -> None:
    small, large = vault_factory(name="small", max_bytes="1MiB"), vault_factory(name="large")
    blob = os.urandom(2 * MiB)
    with Cluster({"kv_cold": [small.address, large.address]}, timeout=10, replication=2) as cluster:
        result = cluster.put(b"ns", {b"k": blob})
        assert (result.stored, result.rejected, result.lagging) == (1, 0, 1)
        assert result.rejections == (Rejection(b"k", small.address, REFUSED),)


def test_the_vllm_worker_counts_refused_blocks(vault_factory: VaultFactory, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.connectors.vllm.test_worker_logic import kv_caches, kv_view, make_worker, refs, store

    v = vault_factory(extra_args=token_file_args(tmp_path, "tok-tiny tiny user 1KiB\n"))
    cluster = functools.partial(Cluster, token="tok-tiny")
    worker = make_worker(v.address, {0: [kv_view(kv_caches())]}, cluster=cluster)  # type: ignore[arg-type]
    try:
        store(worker, "a", refs(0, [0, 1, 2], [3, 4, 5]))
        totals = worker.counters.totals()
        assert (totals["stored_blocks"], totals["store_failures"], totals["store_rejected"]) == (0, 3, 3)
    finally:
        worker.shutdown()
