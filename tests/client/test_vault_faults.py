"""The inference side under vault faults, with real vault processes on loopback: what the cluster (and so
every engine hook's pipeline) answers, how long a call blocks, what the counters say, and that it recovers
without a restart. docs/operations/faults.md says the same to operators."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from tests.conftest import VaultFactory
from tests.processes import stopped
from tierkv.client.breaker import BreakerState
from tierkv.client.cluster import Cluster
from tierkv.roles import Role

NS = b"f" * 16


def keys(n: int, tag: bytes = b"k") -> list[bytes]:
    return [tag + b"%05d" % i for i in range(n)]


def sample(cluster: Cluster, name: str, **labels: str) -> float:
    return cluster.metrics.registry.get_sample_value(name, labels) or 0.0


class FrozenClock:
    """The breakers' clock: it never moves unless a test moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def small_inflight(tmp_path: Path) -> list[str]:
    """A vault that refuses any Put of more than 1 MiB at once, on both transports (RESOURCE_EXHAUSTED),
    as a vault whose disk is full refuses every Put."""
    cfg = tmp_path / "inflight.toml"
    cfg.write_text('[vault]\ngrpc_max_inflight_bytes = "1MiB"\nbulk_max_inflight_bytes = "1MiB"\n')
    return ["--config", str(cfg)]


def test_a_vault_refusing_puts_keeps_serving_reads_and_its_refusals_count_as_rejected(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    """Refusals are answers: they neither open the breaker (which would turn the reads the vault can
    serve into misses for its backoff) nor count as unanswered; each refused blob is rejected, with the
    vault's reason."""
    v = vault_factory(extra_args=small_inflight(tmp_path))
    held = {k: os.urandom(4096) for k in keys(4)}
    with Cluster({"kv_cold": [v.address]}, timeout=5.0, breaker_threshold=2, clock=FrozenClock()) as c:
        assert c.put(NS, held).stored == len(held)
        for _ in range(4):
            result = c.put(NS, {b"big": os.urandom(2 << 20)})
            assert (result.stored, result.rejected, result.failed) == (0, 1, 0), result
            assert "RESOURCE_EXHAUSTED" in result.rejections[0].reason
        assert c.prefix_lookup(NS, list(held)) == len(held), "reads go on while Puts are refused"
        assert c.get(NS, list(held)) == list(held.values())
        member = c._members["kv_cold"][0]
        assert member.breaker.state is BreakerState.CLOSED
        assert sample(c, "tierkv_client_skipped_total", vault=v.address) == 0
        assert sample(c, "tierkv_client_failures_total", vault=v.address, method="put") == 0
        assert sample(c, "tierkv_client_refused_total", vault=v.address, method="put") == 4
        assert sample(c, "tierkv_client_put_keys_total", role="kv_cold", outcome="rejected") == 4
        assert sample(c, "tierkv_client_put_keys_total", role="kv_cold", outcome="failed") == 0


def test_a_stalled_shard_never_makes_the_other_shards_keys_misses(vault_factory: VaultFactory) -> None:
    """Two kv_cold shards, one SIGSTOPped (its socket open, never answering), its breaker still closed:
    each of many concurrent reads waits one timeout for it, and the live shard's keys are hits in every
    one of them. The calls to the stalled vault hold threads until their deadline; they must not hold the
    ones the other vault's calls need (its keys were misses, counted nowhere, when they queued behind)."""
    vaults = [vault_factory(name=f"v{i}") for i in range(2)]
    ks = keys(64)
    blobs = {k: os.urandom(512) for k in ks}
    timeout = 1.0
    roles = {"kv_cold": [v.address for v in vaults]}
    with Cluster(roles, timeout=timeout, breaker_threshold=1000, clock=FrozenClock()) as c:
        assert c.put(NS, blobs).stored == len(ks)
        live = [k for k in ks if c._rings[Role.KV_COLD].owners(k)[0] == 0]
        assert 0 < len(live) < len(ks)
        start = threading.Barrier(READERS)
        answers: list[tuple[float, list[bytes | None]]] = []

        def read() -> None:
            start.wait(timeout=10)
            t0 = time.monotonic()
            got = c.get(NS, ks)
            answers.append((time.monotonic() - t0, got))

        with stopped(vaults[1]):
            readers = [threading.Thread(target=read) for _ in range(READERS)]
            for t in readers:
                t.start()
            for t in readers:
                t.join(timeout=10 * timeout)
            assert not any(t.is_alive() for t in readers)
        assert len(answers) == READERS
        for elapsed, got in answers:
            assert elapsed < 2.5 * timeout, f"a read took {elapsed:.2f} s with a {timeout} s timeout"
            found = {k for k, g in zip(ks, got, strict=True) if g is not None}
            assert found == set(live), f"{len(set(live) - found)} keys of the live shard missed"
            assert all(g == blobs[k] for k, g in zip(ks, got, strict=True) if g is not None)


READERS = 8
"""Concurrent reads: twice the threads the cluster kept for two vaults before reads of one vault stopped
waiting on another's."""
