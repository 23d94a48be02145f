"""Retention on real vaults over loopback: metadata sent by the clients, protection, the protected cap,
time to live, per-class feedback in Stats and metrics, garbage metadata refused, and old clients (no
metadata) served exactly as before under lru."""

from __future__ import annotations

import asyncio
import os
import urllib.request
from pathlib import Path

import grpc
import pytest

from tests.client.inproc import InProcessVault
from tests.conftest import VaultFactory
from tests.ports import free_port
from tests.vault.rawcalls import Ident, get, put, stats
from tests.vault.test_store import LRUModel
from tierkv.client import VaultClient
from tierkv.client.aio import AsyncVaultClient
from tierkv.client.cluster import Cluster
from tierkv.retention import BlockMeta
from tierkv.vault.launcher import VaultProcess
from tierkv.wire import SERVICE, pb
from tierkv.wire.framing import build_frame

AXIOMS = BlockMeta("axioms", 1.0, protected=True)
GENERATION = BlockMeta("generation", 0.1)


def configured(vault_factory: VaultFactory, tmp_path: Path, toml: str, **kw: object) -> VaultProcess:
    cfg = tmp_path / f"cfg{len(list(tmp_path.glob('cfg*')))}.toml"
    cfg.write_text(toml)
    extra = [*kw.pop("extra_args", []), "--config", str(cfg)]  # type: ignore[misc]
    return vault_factory(extra_args=extra, **kw)


@pytest.mark.parametrize("policy", ["context", "lru"])
def test_protected_blocks_survive_tenfold_overfill(
    vault_factory: VaultFactory, tmp_path: Path, policy: str
) -> None:
    v = configured(vault_factory, tmp_path, f'[vault]\npolicy = "{policy}"\n', max_bytes="4MiB")
    system = {b"sys%d" % i: os.urandom(32 * 1024) for i in range(32)}  # 1 MiB of a 4 MiB vault
    with Cluster({"kv_cold": v.address}, timeout=10) as cluster:
        assert cluster.put(b"ns", system, meta=dict.fromkeys(system, AXIOMS)).stored == 32
        for i in range(0, 40 * 1024 // 64, 16):  # 40 MiB of generation, 64 KiB blobs
            batch = {b"gen%d" % j: os.urandom(64 * 1024) for j in range(i, i + 16)}
            cluster.put(b"ns", batch, meta=dict.fromkeys(batch, GENERATION))
        assert cluster.get(b"ns", list(system)) == list(system.values())
        ((_, _, s),) = cluster.stats()
    assert not isinstance(s, Exception)
    assert s.used_bytes <= s.max_bytes and s.evictions > 500
    assert s.protected_bytes == sum(len(b"ns") + len(k) + len(d) for k, d in system.items())


def test_the_protected_cap_holds_and_overflow_is_stored_unprotected(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    # under lru the flood pushes out what is not protected (adaptive would keep the overflow: important)
    text = '[vault]\npolicy = "lru"\n[retention]\nmax_protected_fraction = 0.25\n'
    v = configured(vault_factory, tmp_path, text, max_bytes="4MiB")
    pinned = {b"sys%d" % i: os.urandom(64 * 1024) for i in range(32)}  # 2 MiB asked, 1 MiB allowed
    with VaultClient(v.address, timeout=10) as c:
        c.put(b"ns", pinned, meta=dict.fromkeys(pinned, AXIOMS))
        s = c.stats()
        assert s.protected_bytes <= 1 << 20 and s.protected_overflow == 32 - s.protected_bytes // (
            64 * 1024 + 6
        )
        for i in range(0, 256, 16):  # 16 MiB of untagged blobs
            c.put(b"ns", {b"u%d" % j: os.urandom(64 * 1024) for j in range(i, i + 16)})
        kept = [k for k, blob in zip(pinned, c.get(b"ns", list(pinned)), strict=True) if blob is not None]
    assert len(kept) == s.protected_bytes // (64 * 1024 + 6)
    assert "protected bytes at the cap" in v.log_tail(200)
    assert v.log_tail(200).count("protected bytes at the cap") == 1  # rate-limited


def test_time_to_live_reads_as_a_miss_and_is_counted(tmp_path: Path) -> None:
    """Over the real service and store in this process, on a clock the test moves (a vault process
    would make the test sleep out the time to live)."""
    now = [1_700_000_000.0]
    vault = InProcessVault(tmp_path / "v", "inproc:1", clock=lambda: now[0])
    with vault.client() as c:
        c.put(b"ns", {b"a": b"x" * 100, b"b": b"y" * 100}, meta={b"a": BlockMeta("generation", ttl_s=0.3)})
        assert c.prefix_lookup(b"ns", [b"a", b"b"]) == 2
        now[0] += 0.31
        assert c.get(b"ns", [b"a", b"b"]) == [None, b"y" * 100]
        assert c.prefix_lookup(b"ns", [b"a", b"b"]) == 0
        s = c.stats()
    vault.close()
    assert s.expired == 1
    gen = next(cl for cl in s.classes if cl.source == "generation")
    assert (gen.expired, gen.misses, gen.hits_5m, gen.lookups_5m) == (1, 1, 0, 1)


def test_per_class_figures_in_stats_and_metrics(vault_factory: VaultFactory) -> None:
    port = free_port()
    v = vault_factory(extra_args=["--metrics-port", str(port)])
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"t": b"x" * 1000, b"u": b"y" * 10}, meta={b"t": BlockMeta("tools", 0.7)})
        c.get(b"ns", [b"t", b"u", b"t", b"nope"])
        classes = {cl.source: cl for cl in c.stats().classes}
    assert (classes["tools"].hits, classes["tools"].bytes, classes["tools"].hit_rate_5m) == (2, 1003, 1.0)
    assert (classes[""].hits, classes[""].misses, classes[""].keys) == (1, 1, 1)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'tierkv_vault_class_hits_total{source="tools",tenant="default"} 2.0' in text
    assert 'tierkv_vault_class_bytes{source="tools",tenant="default"} 1003.0' in text
    assert 'tierkv_vault_protected_overflow_total{tenant="default"} 0.0' in text


def test_garbage_metadata_is_invalid_argument_and_the_vault_keeps_serving(vault: VaultProcess) -> None:
    header = pb.FrameHeader(namespace=b"ns")
    header.segments.add(key=b"k", status=pb.FOUND, size=1, length=1, meta=pb.BlockMeta(importance=7.0))
    with grpc.insecure_channel(vault.address) as ch:
        call = ch.stream_unary(f"/{SERVICE}/Put", Ident, Ident)
        with pytest.raises(grpc.RpcError) as err:
            call(iter([build_frame(header, [b"z"])]), timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert get(ch, b"ns", [b"k"]) == [None]
    with VaultClient(vault.address) as c:
        with pytest.raises(ValueError):
            BlockMeta("x", importance=2.0)
        assert c.put(b"ns", {b"k": b"v"}) == 1
        assert c.health()


def test_the_async_client_sends_metadata(vault: VaultProcess) -> None:
    async def run() -> None:
        async with AsyncVaultClient(vault.address) as c:
            await c.put(b"ns", {b"a": b"x"}, meta={b"a": BlockMeta("memories", 0.75)})
            assert await c.get(b"ns", [b"a"]) == [b"x"]

    asyncio.run(run())
    with VaultClient(vault.address) as c:
        assert [cl.source for cl in c.stats().classes if cl.keys] == ["memories"]


def test_old_clients_without_metadata_get_lru_exactly_as_before(vault_factory: VaultFactory) -> None:
    """Raw Puts as a client from before the metadata field sends them, against an exact LRU model (the
    vault configured with ``lru``, the default before ``adaptive``)."""
    budget = 2 << 20
    v = vault_factory(max_bytes=budget, extra_args=["--policy", "lru"])
    model = LRUModel(budget, b"ns")
    rng = __import__("random").Random(3)
    with grpc.insecure_channel(v.address) as ch:
        for step in range(60):
            if step % 3 == 2:
                keys = [b"k%d" % rng.randint(0, 50) for _ in range(4)]
                assert get(ch, b"ns", keys) == model.get(keys)
                continue
            items = {b"k%d" % rng.randint(0, 50): os.urandom(rng.randint(50_000, 200_000)) for _ in range(3)}
            reply = put(ch, b"ns", items)
            model.put(list(items.items()))
            s = stats(ch)
            assert reply.stored == len(items) and s.used_bytes == model.used <= budget, step
            assert s.protected_bytes == 0 and len(s.classes) == 1 and s.classes[0].source == ""
        keys = [b"k%d" % i for i in range(51)]
        assert get(ch, b"ns", keys) == [model.entries.get(k) for k in keys]
