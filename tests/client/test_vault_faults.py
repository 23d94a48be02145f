"""The inference side under vault faults, with real vault processes on loopback: what the cluster (and so
every engine hook's pipeline) answers, how long a call blocks, what the counters say, and that it recovers
without a restart. docs/operations/faults.md says the same to operators."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import numpy as np

from tests.conftest import VaultFactory
from tests.processes import stopped
from tierkv.client.breaker import BreakerState
from tierkv.client.cluster import Cluster
from tierkv.codec import Buffer, LayerGroup
from tierkv.records import PutResult
from tierkv.roles import Role
from tierkv.tiering import ColdTier, NumpyArrays, StoreTally, StreamSpec

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


def wait_for_queued_bytes(*ports: int | None, timeout: float = 10.0) -> None:
    """Until a connection to one of ``ports`` on this machine holds bytes its (stopped) vault has not
    read: the kernel's own table of TCP sockets (``/proc/net/tcp*``: local port, state, rx queue)."""
    wanted = {p for p in ports if p}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                port, rx = int(fields[1].rsplit(":", 1)[1], 16), int(fields[4].split(":")[1], 16)
                if port in wanted and fields[3] == ESTABLISHED and rx > 0:
                    return
        time.sleep(0.01)
    raise AssertionError(f"no bytes queued to ports {sorted(wanted)} within {timeout} s")


ESTABLISHED = "01"
"""A connected socket's state in /proc/net/tcp (a listening one's rx queue counts connections)."""


# -- the pipeline every hook uses, over a real vault ------------------------------------------------------

SPEC = StreamSpec(hashlib.sha256(b"faults").digest(), LayerGroup.ATTENTION)
SHAPE = (2, 2, 16, 64)
TOKENS = 16


class Blocks:
    """``n`` blocks of random values under chained-looking keys, and a tier to store and restore them."""

    def __init__(self, cluster: Cluster, n: int, tag: bytes = b"b", seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.tier = ColdTier(cluster, NumpyArrays())
        self.keys = [hashlib.sha256(tag + bytes([i])).digest() for i in range(n)]
        self.values = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(n)]

    def store(self) -> StoreTally:
        return self.tier.store(SPEC, ((k, a, TOKENS) for k, a in zip(self.keys, self.values, strict=True)))

    def restore(self) -> tuple[float, list[int]]:
        """Seconds the restore took and the blocks it decoded, each checked against what was stored."""
        out = [np.zeros(SHAPE, np.float32) for _ in self.keys]
        t0 = time.monotonic()
        restored = self.tier.restore(SPEC, self.keys, SPEC.expect(SHAPE, TOKENS), out=lambda n: out[n])
        elapsed = time.monotonic() - t0
        for n, i in enumerate(restored.decoded):
            assert np.array_equal(out[n], self.values[i]), f"block {i} restored with other values"
        return elapsed, restored.decoded

    def lookup(self) -> tuple[float, int]:
        t0 = time.monotonic()
        hits = self.tier.lookup(SPEC, self.keys)
        return time.monotonic() - t0, hits


def test_a_stalled_vault_costs_each_pipeline_call_one_timeout_until_its_breaker_opens(
    vault_factory: VaultFactory,
) -> None:
    """SIGSTOPped during lookup, restore and store: each returns a miss (nothing stored, nothing decoded)
    within one timeout; after three failures the breaker answers at once; once the vault resumes and
    the backoff is over, the same cluster restores every block as stored."""
    v = vault_factory()
    clock = FrozenClock()
    timeout = 1.0
    with Cluster({"kv_cold": [v.address]}, timeout=timeout, clock=clock) as c:
        held = Blocks(c, 8)
        assert held.store().stored == 8
        late = Blocks(c, 8, tag=b"late")
        with stopped(v):
            elapsed, hits = held.lookup()
            assert hits == 0 and elapsed < 1.6 * timeout
            elapsed, decoded = held.restore()
            assert decoded == [] and elapsed < 1.6 * timeout
            t0 = time.monotonic()
            tally = late.store()
            assert (tally.sent, tally.stored, tally.rejected) == (8, 0, 0)
            assert time.monotonic() - t0 < 1.6 * timeout + 1.0, "a Put's deadline grows with its bytes"
            elapsed, hits = held.lookup()
            assert hits == 0 and elapsed < 0.1, "the breaker is open: no call goes out"
        assert sample(c, "tierkv_client_failures_total", vault=v.address, method="prefix_lookup") == 1
        assert sample(c, "tierkv_client_failures_total", vault=v.address, method="get") == 1
        assert sample(c, "tierkv_client_failures_total", vault=v.address, method="put") == 1
        assert sample(c, "tierkv_client_skipped_total", vault=v.address) == 1
        assert sample(c, "tierkv_client_put_keys_total", role="kv_cold", outcome="failed") == 8
        clock.now += 60.0
        assert held.lookup()[1] == 8
        assert held.restore()[1] == list(range(8))


def test_a_vault_killed_mid_fetch_hands_over_only_whole_blocks_as_stored(vault_factory: VaultFactory) -> None:
    """SIGKILL while a BatchGet's reply streams in: the blobs that arrived whole are handed over (each the
    one stored under its key), the rest are misses, the call fails at once and is counted."""
    v = vault_factory(max_bytes="256MiB")
    ks = keys(96)
    blobs = {k: os.urandom(256 << 10) for k in ks}
    with Cluster({"kv_cold": [v.address]}, timeout=5.0) as c:
        assert c.put(NS, blobs).stored == len(ks)
        handed: dict[int, bytes] = {}

        def sink(i: int, blob: Buffer) -> None:
            handed[i] = bytes(blob)
            if len(handed) == 2:
                v.kill()

        t0 = time.monotonic()
        sizes = c.get_each(NS, ks, sink)
        assert time.monotonic() - t0 < 5.0
        assert 2 <= len(handed) < len(ks), "the reply broke off part-way"
        assert all(blob == blobs[ks[i]] for i, blob in handed.items())
        assert {i for i, s in enumerate(sizes) if s is not None} == set(handed)
        assert sample(c, "tierkv_client_failures_total", vault=v.address, method="get") == 1


def test_a_vault_killed_mid_put_keeps_what_it_acknowledged_and_serves_it_after_a_restart_on_its_port(
    vault_factory: VaultFactory,
) -> None:
    """SIGKILL while a Put streams in: none of that Put counts as stored; the blocks acknowledged before
    are all there, as stored, when the vault comes back on the same port, and the same cluster (its
    connections and leases from before the crash) reads them once its breaker lets it."""
    v = vault_factory(max_bytes="256MiB")
    clock = FrozenClock()
    with Cluster({"kv_cold": [v.address]}, timeout=5.0, clock=clock) as c:
        held = Blocks(c, 8)
        assert held.store().stored == 8
        assert held.tier.lookup(SPEC, held.keys, lease_ms=60_000) == 8
        cut = {k: os.urandom(1 << 20) for k in keys(48, b"cut")}
        results: list[PutResult] = []
        with stopped(v):  # the Put's bytes fill the socket buffers and wait there
            putter = threading.Thread(target=lambda: results.append(c.put(NS, cut)))
            putter.start()
            wait_for_queued_bytes(v.port, c._members[Role.KV_COLD][0].client.bulk_port)
            v.kill()
        putter.join(timeout=10)
        assert not putter.is_alive()
        [result] = results
        assert (result.stored, result.failed) == (0, len(cut))
        restarted = vault_factory(name=v.path.name, port=v.port, max_bytes="256MiB")
        deadline = time.monotonic() + 10
        while held.lookup()[1] != 8 and time.monotonic() < deadline:
            clock.now += 60.0  # the breaker's backoff; gRPC's own reconnect may refuse the first probes
            time.sleep(0.05)
        assert held.restore()[1] == list(range(8))
        restarted.stop()


def test_a_rotated_token_is_a_miss_and_the_vault_is_used_again_once_it_takes_the_token(
    vault_factory: VaultFactory,
) -> None:
    """The vault restarts with a token this side does not have: every call is refused UNAUTHENTICATED,
    counted as a failure, and the breaker opens (each refusal costs a round trip, never a timeout). Once
    the vault takes this side's token again, the same cluster reads again."""
    old, new = "o" * 24, "n" * 24
    v = vault_factory(env={"TIERKV_TOKEN": old})
    clock = FrozenClock()
    with Cluster({"kv_cold": [v.address]}, timeout=2.0, token=old, clock=clock) as c:
        held = Blocks(c, 4)
        assert held.store().stored == 4
        v.stop()
        rotated = vault_factory(name=v.path.name, port=v.port, env={"TIERKV_TOKEN": new})
        for _ in range(3):
            elapsed, hits = held.lookup()
            assert hits == 0 and elapsed < 1.0
        assert c._members["kv_cold"][0].breaker.state is BreakerState.OPEN
        assert sample(c, "tierkv_client_failures_total", vault=v.address, method="prefix_lookup") >= 1
        rotated.stop()
        back = vault_factory(name=v.path.name, port=v.port, env={"TIERKV_TOKEN": old})
        deadline = time.monotonic() + 10
        while held.lookup()[1] != 4 and time.monotonic() < deadline:
            clock.now += 60.0
            time.sleep(0.05)
        assert held.restore()[1] == list(range(4))
        back.stop()


def test_an_answer_after_the_deadline_never_reaches_a_later_call(vault_factory: VaultFactory) -> None:
    """The vault resumes just after a restore gave up on it: its late answer is dropped with the
    connection, and the next restore, of other blocks, gets exactly those blocks."""
    v = vault_factory()
    timeout = 0.5
    with Cluster({"kv_cold": [v.address]}, timeout=timeout, clock=FrozenClock()) as c:
        first, second = Blocks(c, 16, tag=b"one", seed=1), Blocks(c, 16, tag=b"two", seed=2)
        assert first.store().stored == second.store().stored == 16
        with stopped(v):
            assert first.restore()[1] == []
        assert second.restore()[1] == list(range(16))
        assert first.restore()[1] == list(range(16))


def test_a_hybrid_hit_is_not_claimed_while_its_state_vault_is_down(vault_factory: VaultFactory) -> None:
    """kv_cold up, ssm_cold down: the attention blocks are there, the recurrent states are not, so a hit
    that needs both is none, in milliseconds (nothing listens), and only the ssm_cold vault is counted."""
    kv, ssm = vault_factory(name="kv"), vault_factory(name="ssm", role="ssm_cold")
    roles = {"kv_cold": [kv.address], "ssm_cold": [ssm.address]}
    with Cluster(roles, timeout=2.0, clock=FrozenClock()) as c:
        held = Blocks(c, 8)
        state = SPEC.sibling(LayerGroup.SSM)
        assert held.store().stored == 8
        tally = held.tier.store(state, ((k, a, TOKENS) for k, a in zip(held.keys, held.values, strict=True)))
        assert tally.stored == 8 and held.tier.lookup_all([SPEC, state], held.keys) == 8
        ssm.kill()
        t0 = time.monotonic()
        assert held.tier.lookup_all([SPEC, state], held.keys) == 0
        assert time.monotonic() - t0 < 1.0
        assert held.lookup()[1] == 8, "the attention blocks are still there"
        assert sample(c, "tierkv_client_failures_total", vault=ssm.address, method="prefix_lookup") == 1
        assert sample(c, "tierkv_client_failures_total", vault=kv.address, method="prefix_lookup") == 0


def test_a_put_over_grpc_to_a_stalled_vault_ends_at_its_deadline(vault_factory: VaultFactory) -> None:
    """Puts go over gRPC when the bulk port is off (TLS on, ``bulk = false``, a vault without bulk Put).
    Once a stalled vault's flow-control window is full (a few MiB), gRPC's blocking stream call waited
    past its deadline for as long as the vault stayed stopped; the Put ends at its deadline instead."""
    v = vault_factory(max_bytes="256MiB")
    timeout = 1.0
    blobs = {k: os.urandom(256 << 10) for k in keys(64)}  # 16 MiB: deadline 1 s + 16 MiB at 100 MB/s
    with Cluster({"kv_cold": [v.address]}, timeout=timeout, bulk=False) as c:
        assert c.put(NS, {b"warm": b"x"}).stored == 1
        results: list[tuple[float, PutResult]] = []

        def put() -> None:
            t0 = time.monotonic()
            result = c.put(NS, blobs)
            results.append((time.monotonic() - t0, result))

        with stopped(v):
            putter = threading.Thread(target=put)
            putter.start()
            putter.join(timeout=10 * timeout)
            hung = putter.is_alive()
        putter.join(timeout=30)
        assert not hung, "the Put was still waiting 10 timeouts later"
        [(elapsed, result)] = results
        assert (result.stored, result.failed) == (0, len(blobs))
        assert elapsed < 2.5 * timeout
        assert sample(c, "tierkv_client_failures_total", vault=v.address, method="put") == 1


def test_a_put_cut_short_after_some_of_its_batches_counts_those_as_the_vault_said(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    """A put larger than one Put goes as several; when a later one is refused (or fails), what the
    replies before it said still counts: those blobs are stored, not unacknowledged."""
    v = vault_factory(extra_args=small_inflight(tmp_path))
    small = {b"a": os.urandom(600 << 10), b"b": os.urandom(600 << 10)}
    too_big = {b"c": os.urandom(2 << 20)}
    with Cluster({"kv_cold": [v.address]}, timeout=5.0, max_batch_bytes=1 << 20) as c:
        result = c.put(NS, {**small, **too_big})
        assert (result.stored, result.rejected, result.failed) == (2, 1, 0), result
        assert result.unstored == (b"c",)
        assert "RESOURCE_EXHAUSTED" in result.rejections[0].reason
        assert c.get(NS, list(small)) == list(small.values())
        assert sample(c, "tierkv_client_put_keys_total", role="kv_cold", outcome="stored") == 2
