"""The inference side under vault faults, with real vault processes on loopback: what the cluster (and so
every engine hook's pipeline) answers, how long a call blocks, what the counters say, and that it recovers
without a restart. docs/operations/faults.md says the same to operators."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import VaultFactory
from tierkv.client.breaker import BreakerState
from tierkv.client.cluster import Cluster

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
