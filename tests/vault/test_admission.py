"""Admission on real vault processes over loopback: one tenant's flood of leased lookups (bounded in count
and time) leaves health checks and another tenant's Puts answered; refusals are RESOURCE_EXHAUSTED, which
the client reports as a miss. The slot accounting itself is checked directly with threads."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import VaultFactory
from tests.vault.rawcalls import Ident, metadata
from tierkv import VaultClient
from tierkv.vault.admission import Admission, AdmissionLimits
from tierkv.vault.status import Abort
from tierkv.wire import SERVICE, pb

TOKENS = """\
tok-admin ops   admin
tok-a     alpha user
tok-b     beta  user
"""
FLOOD_THREADS = 48
FLOOD_CALLS = 40
"""Lookups per flooding thread (the flood also ends after FLOOD_S)."""
FLOOD_S = 20.0


def health_check(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        return int(reply.status)


def test_health_and_another_tenants_puts_are_answered_under_a_lookup_flood(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    (tmp_path / "tokens").write_text(TOKENS)
    cfg = tmp_path / "vault.toml"
    cfg.write_text(f'[vault]\nworkers = 2\n[auth]\ntoken_file = "{tmp_path / "tokens"}"\n')
    v = vault_factory(extra_args=["--config", str(cfg)])
    keys = [b"%06d" % i for i in range(2000)]
    with VaultClient(v.address, token="tok-a") as alpha:
        assert alpha.put(b"ns", {k: b"x" for k in keys}) == len(keys)
    request = pb.PrefixLookupRequest(namespace=b"ns", keys=keys, lease_ms=5000).SerializeToString()
    codes: list[grpc.StatusCode] = []
    stop = threading.Event()

    def flood() -> None:
        end = time.monotonic() + FLOOD_S
        with grpc.insecure_channel(v.address) as ch:  # a connection of its own per flooding thread
            call = ch.unary_unary(f"/{SERVICE}/PrefixLookup", Ident, Ident)
            for _ in range(FLOOD_CALLS):
                if stop.is_set() or time.monotonic() > end:
                    return
                try:
                    call(request, timeout=30, metadata=metadata("tok-a"))
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    codes.append(exc.code())

    with ThreadPoolExecutor(FLOOD_THREADS) as pool:
        flooding = [pool.submit(flood) for _ in range(FLOOD_THREADS)]
        try:
            health = []
            stored = []
            with VaultClient(v.address, token="tok-b", timeout=30) as beta:
                for i in range(20):
                    health.append(health_check(v.address))
                    stored.append(beta.put(b"beta", {b"k%d" % i: os.urandom(64 << 10)}))
            assert all(f.running() or f.done() for f in flooding)
        finally:
            stop.set()
        for f in flooding:
            f.result()
    assert health == [health_pb2.HealthCheckResponse.SERVING] * 20
    assert stored == [1] * 20
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, set(codes)
    assert codes.count(grpc.StatusCode.OK) > 0


def test_a_refused_lookup_is_a_miss_to_the_client(vault_factory: VaultFactory, tmp_path: Path) -> None:
    """A client whose lookup is refused for want of a slot sees RESOURCE_EXHAUSTED (the cluster counts it
    as a miss); with the slot back, the same lookup answers."""
    cfg = tmp_path / "vault.toml"
    cfg.write_text("[vault]\nworkers = 1\n")
    v = vault_factory(extra_args=["--config", str(cfg)])
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"a": b"1"})
        release = threading.Event()
        # hold the only slot: a gRPC Put that never ends its stream
        with grpc.insecure_channel(v.address) as ch:
            put = ch.stream_unary(f"/{SERVICE}/Put", Ident, Ident)
            held = put.future(iter(lambda: release.wait(30) and b"", b""), timeout=30)
            try:
                deadline = time.monotonic() + 10
                refused = None
                while refused is None and time.monotonic() < deadline:
                    try:
                        c.prefix_lookup(b"ns", [b"a"])
                    except Exception as exc:  # the slot is not taken yet until this fails
                        refused = exc
                assert refused is not None and "RESOURCE_EXHAUSTED" in str(refused) + type(refused).__name__
            finally:
                release.set()
            assert held.result(timeout=30) == b""  # an empty Put stores nothing
        assert c.prefix_lookup(b"ns", [b"a"]) == 1


def test_a_tenant_runs_at_most_its_share_and_waits_then_runs() -> None:
    adm = Admission(AdmissionLimits(running=4, waiting=4, per_connection=8, wait_s=30), tenants=2)
    assert adm.tenant_running == 3 and adm.tenant_waiting == 3
    with adm.admit("a", "c1"), adm.admit("a", "c2"), adm.admit("a", "c3"):
        got = threading.Event()

        def fourth() -> None:
            with adm.admit("a", "c4"):
                got.set()

        t = threading.Thread(target=fourth)
        t.start()
        deadline = time.monotonic() + 10
        while adm.waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert adm.waiting == 1 and not got.is_set()  # the fourth of tenant a waits for a slot
        with adm.admit("b", "c5"):  # while tenant b runs at once
            assert adm.running == 4
    t.join(10)
    assert got.is_set() and adm.running == 0 and adm.waiting == 0


def test_refusals_past_the_queue_and_per_connection() -> None:
    adm = Admission(AdmissionLimits(running=1, waiting=1, per_connection=2, wait_s=0.0), tenants=1)
    with adm.admit("t", "c"):
        with pytest.raises(Abort, match="no slot"):
            with adm.admit("t", "c"):
                pass  # waits 0 s: refused
        with pytest.raises(Abort, match="busy"):
            adm._waiting["t"] = 1  # the queue is full
            with adm.admit("t", "d"):
                pass
        adm._waiting.clear()
    adm2 = Admission(AdmissionLimits(running=4, waiting=0, per_connection=2), tenants=1)
    with adm2.admit("t", "c"), adm2.admit("t", "c"):
        with pytest.raises(Abort, match="this connection"):
            with adm2.admit("t", "c"):
                pass
        with adm2.admit("t", "other"):
            assert adm2.running == 3
    assert adm.refused == 2 and adm2.refused == 1


def test_health_answers_while_every_call_slot_is_held(vault_factory: VaultFactory, tmp_path: Path) -> None:
    """One slot (``workers = 1``) and 8 gRPC Puts that never end their streams: the vault's calls are
    held or refused, and health checks still answer SERVING, every one."""
    cfg = tmp_path / "vault.toml"
    cfg.write_text("[vault]\nworkers = 1\n")
    v = vault_factory(extra_args=["--config", str(cfg)])
    release = threading.Event()
    with grpc.insecure_channel(v.address) as ch:
        put = ch.stream_unary(f"/{SERVICE}/Put", Ident, Ident)
        held = [put.future(iter(lambda: release.wait(30) and b"", b""), timeout=30) for _ in range(8)]
        try:
            deadline = time.monotonic() + 10
            while sum(h.done() for h in held) < 7 and time.monotonic() < deadline:
                time.sleep(0.01)  # all but the one running are refused within the wait
            serving = health_pb2.HealthCheckResponse.SERVING
            assert [health_check(v.address) for _ in range(10)] == [serving] * 10
            refused = [h.exception() for h in held if h.done()]
            assert len(refused) == 7
            codes = {e.code() for e in refused if isinstance(e, grpc.RpcError)}
            assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        finally:
            release.set()
