"""The cluster over vaults in this process (tests/client/inproc.py: the real service and store, a mock
transport instead of sockets): fan-out, replicated reads that hedge past a slow owner, breakers on a fake
clock. Milliseconds per test, no process started; test_cluster.py keeps the same promises over sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client.inproc import InProcessVault, factory, vaults
from tierkv.client.cluster import Cluster

NS = b"n" * 16
KEYS = [b"key-%03d" % i for i in range(30)]
BLOBS = {k: k * 50 for k in KEYS}


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def cluster(made: list[InProcessVault], clock: Clock | None = None, **options: object) -> Cluster:
    return Cluster(
        {"kv_cold": [v.address for v in made]},
        client_factory=factory(made),
        clock=clock or Clock(),
        **options,  # type: ignore[arg-type]
    )


def holder(made: list[InProcessVault], key: bytes) -> list[int]:
    return [i for i, v in enumerate(made) if v.store.get_many(NS, [key]) != [None]]


def test_keys_spread_over_the_vaults_and_a_down_vault_is_its_keys_missing(tmp_path: Path) -> None:
    with vaults(tmp_path, 3) as made, cluster(made, timeout=2.0) as c:
        assert c.put(NS, BLOBS).stored == len(KEYS)
        owners = {k: holder(made, k) for k in KEYS}
        assert all(len(o) == 1 for o in owners.values()) and {o[0] for o in owners.values()} == {0, 1, 2}
        assert [made[i].calls.count("Put") for i in range(3)] == [1, 1, 1], "one Put per vault"
        made[1].down = True
        got = c.get_buffers(NS, KEYS)
        for k, blob in zip(KEYS, got, strict=True):
            assert (blob is None) if owners[k] == [1] else bytes(blob or b"") == BLOBS[k]
        assert c.prefix_lookup(NS, KEYS) == next(i for i, k in enumerate(KEYS) if owners[k] == [1])


def test_a_replicated_read_hedges_past_a_slow_owner(tmp_path: Path) -> None:
    with vaults(tmp_path, 2) as made, cluster(made, timeout=1.0, replication=2, hedge_after_s=0.02) as c:
        assert c.put(NS, BLOBS).stored == len(KEYS)
        assert all(holder(made, k) == [0, 1] for k in KEYS)
        slow = made[0]
        slow.delay_s = 1.0  # as long as the deadline: without a hedge its keys would all be misses
        got = c.get_buffers(NS, KEYS)
        assert [bytes(b or b"") for b in got] == [BLOBS[k] for k in KEYS]
        assert made[1].calls.count("BatchGet") >= 1 and slow.calls.count("BatchGet") >= 1


def test_a_breaker_opens_after_failures_and_probes_after_its_backoff(tmp_path: Path) -> None:
    clock = Clock()
    with vaults(tmp_path, 1) as made, cluster(made, clock, timeout=1.0, breaker_threshold=2) as c:
        vault = made[0]
        c.put(NS, BLOBS)
        vault.down = True
        assert c.get_buffers(NS, KEYS[:1]) == [None] and c.get_buffers(NS, KEYS[:1]) == [None]
        asked = len(vault.calls)
        assert c.get_buffers(NS, KEYS[:1]) == [None]
        assert len(vault.calls) == asked, "an open breaker keeps calls off the vault"
        vault.down = False
        clock.t += 1.0  # the backoff is over: one probe goes out, succeeds, and closes the breaker
        assert c.get_buffers(NS, KEYS[:1]) == [BLOBS[KEYS[0]]]
        assert len(vault.calls) == asked + 1
        vault.down = True
        assert c.get_buffers(NS, KEYS[:1]) == [None]
        assert len(vault.calls) == asked + 2, "closed again: one failure does not open it"


def test_a_probe_that_raises_does_not_leave_the_breaker_open_for_good(tmp_path: Path) -> None:
    """A half-open breaker lets one probe out; one that ends in anything but an answer or a VaultError
    (here the caller's own mistake) must still let a later probe go, or the vault is a miss until the
    engine restarts."""
    clock = Clock()
    with vaults(tmp_path, 1) as made, cluster(made, clock, timeout=1.0, breaker_threshold=1) as c:
        vault = made[0]
        c.put(NS, BLOBS)
        vault.down = True
        assert c.get_buffers(NS, KEYS[:1]) == [None]
        vault.down = False
        clock.t += 1.0
        with pytest.raises(ValueError, match="lease_ms"):
            c.prefix_lookup(NS, KEYS, lease_ms=2**32)
        clock.t += 60.0
        assert c.get_buffers(NS, KEYS[:1]) == [BLOBS[KEYS[0]]]


def test_the_breaker_gauge_says_the_state_at_each_scrape(tmp_path: Path) -> None:
    """``tierkv_client_breaker_state`` is what the breaker would do now: closed before any call, open
    after the failures, half-open (the next call probes) once the backoff is over, with no call between."""
    clock = Clock()
    with vaults(tmp_path, 1) as made, cluster(made, clock, timeout=1.0, breaker_threshold=1) as c:
        vault = made[0]

        def gauge() -> float | None:
            labels = {"vault": vault.address}
            return c.metrics.registry.get_sample_value("tierkv_client_breaker_state", labels)

        assert gauge() == 0
        c.put(NS, BLOBS)
        vault.down = True
        assert c.get_buffers(NS, KEYS[:1]) == [None]
        assert gauge() == 2
        clock.t += 1.0
        assert gauge() == 1
        vault.down = False
        assert c.get_buffers(NS, KEYS[:1]) == [BLOBS[KEYS[0]]]
        assert gauge() == 0
