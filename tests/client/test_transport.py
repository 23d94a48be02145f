"""The client's transports against real vault processes: bulk port discovery, refusal, fallback, flush."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.conftest import VaultFactory
from tests.processes import stopped
from tierkv import AsyncVaultClient, VaultClient
from tierkv.client.bulk import BulkFirst
from tierkv.client.transport import BATCH_GET, PREFIX_LOOKUP, PUT, STATS, GrpcTransport, Request, Transport
from tierkv.endpoints import HostPort
from tierkv.errors import VaultUnavailable
from tierkv.retention import BlockMeta
from tierkv.vault.launcher import VaultProcess
from tierkv.wire import bulk, pb


class Counting(Transport):
    """The real gRPC transport, counting the methods that go through it."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.calls: collections.Counter[str] = collections.Counter()

    def handle(self, request: Request) -> bytes:
        self.calls[request.method] += 1
        return self.inner.handle(request)

    def close(self) -> None:
        self.inner.close()


def counted_client(address: str, clock: Callable[[], float] = time.monotonic) -> tuple[VaultClient, Counting]:
    client = VaultClient(address)
    client.transport.close()
    grpc = Counting(GrpcTransport(address, client.options))
    client.transport = BulkFirst(grpc, address, client.options, clock=clock)
    return client, grpc


def vault_with(vault_factory: VaultFactory, tmp_path: Path, config: str, name: str = "vault") -> VaultProcess:
    path = tmp_path / f"{name}.toml"
    path.write_text(config)
    return vault_factory(name=name, extra_args=["--config", str(path)])


@contextmanager
def busy_bulk_connections(port: int, n: int) -> Iterator[None]:
    """``n`` connections that sent a request head and hold the vault waiting for the token.

    On leaving, each is half-closed and read to its end: the vault frees a connection's slot before it
    closes its side, so the slots are free again when the block is left (a vault slow to notice the
    close would otherwise refuse the next bulk connection)."""
    with ExitStack() as stack:
        socks = [
            stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=30)) for _ in range(n)
        ]
        for sock in socks:
            sock.sendall(bulk.REQUEST_HEAD.pack(bulk.MAGIC, bulk.VERSION, bulk.OP_BATCH_GET, 64))
        time.sleep(0.2)  # the vault's connection threads read the heads (nothing to wait on but time)
        yield
        for sock in socks:
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(1 << 16):
                pass


def test_the_bulk_port_is_asked_for_once_not_per_get(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    client, grpc = counted_client(v.address)
    with client:
        client.put(b"ns", {b"k": b"v"})
        for _ in range(20):
            assert client.get(b"ns", [b"k"]) == [b"v"]
        assert grpc.calls[STATS] == 1 and grpc.calls[BATCH_GET] == 0, grpc.calls
        assert client.bulk_port == client.stats().bulk_port


def test_puts_go_over_the_bulk_port_with_the_same_result(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    blobs = {f"k{i}".encode(): os.urandom(300_000 * (i + 1)) for i in range(6)}
    client, grpc = counted_client(v.address)
    with client:
        assert client.put(b"ns", blobs, meta={b"k0": BlockMeta(source="system", importance=0.9)}) == 6
        assert client.get(b"ns", list(blobs)) == list(blobs.values())
        assert grpc.calls[PUT] == 0 and grpc.calls[STATS] == 1, grpc.calls
        assert isinstance(client.transport, BulkFirst) and client.transport.bulk_put
        assert client.inspect(b"ns", b"k0").source == "system", "retention metadata travels too"


class Predating(Counting):
    """A vault that predates bulk Put and bulk PrefixLookup, as its clients see it: its Stats never say
    ``bulk_put`` or ``bulk_lookup``."""

    def handle(self, request: Request) -> bytes:
        reply = super().handle(request)
        if request.method != STATS:
            return reply
        stats = pb.StatsReply.FromString(reply)
        stats.bulk_put = stats.bulk_lookup = False
        return stats.SerializeToString()


def test_puts_and_lookups_to_a_vault_that_predates_them_on_the_bulk_port_stay_on_grpc(
    vault_factory: VaultFactory,
) -> None:
    v = vault_factory()
    client = VaultClient(v.address)
    client.transport.close()
    grpc = Predating(GrpcTransport(v.address, client.options))
    client.transport = BulkFirst(grpc, v.address, client.options)
    with client:
        client.put(b"ns", {b"a": b"1"})
        client.put(b"ns", {b"b": b"2"})
        assert client.get(b"ns", [b"a", b"b"]) == [b"1", b"2"]
        assert client.prefix_lookup(b"ns", [b"a", b"b"]) == 2
        assert grpc.calls[PUT] == 2 and grpc.calls[PREFIX_LOOKUP] == 1, grpc.calls
        assert grpc.calls[BATCH_GET] == 0 and client.bulk_port is not None


def test_lookups_go_over_the_bulk_port_with_the_same_answer(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    client, grpc = counted_client(v.address)
    with client:
        client.put(b"ns", {b"a": b"1", b"b": b"2"})
        assert client.prefix_lookup(b"ns", [b"a", b"b", b"c"], lease_ms=1000) == 2
        assert client.prefix_lookup(b"ns", [b"c", b"a"]) == 0
        assert grpc.calls[PREFIX_LOOKUP] == 0 and grpc.calls[STATS] == 1, grpc.calls
        leases = client.stats().leases
        assert leases is not None and leases.granted == 2


def test_a_put_to_a_stalled_vault_over_the_bulk_port_is_unavailable_in_time(
    vault_factory: VaultFactory,
) -> None:
    v = vault_factory()
    with VaultClient(v.address, timeout=0.5) as c:
        c.put(b"ns", {b"k": b"v"})
        assert isinstance(c.transport, BulkFirst) and c.transport.bulk_put
        with stopped(v):
            start = time.monotonic()
            with pytest.raises(VaultUnavailable):
                c.put(b"ns", {b"big": os.urandom(16 << 20)})
            assert time.monotonic() - start < 10


def test_a_busy_bulk_port_falls_back_to_grpc_then_is_used_again(
    vault_factory: VaultFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    v = vault_with(vault_factory, tmp_path, "[vault]\nbulk_max_connections = 2\n")
    with VaultClient(v.address, bulk=False) as writer:  # so that no pooled bulk connection of ours is left
        writer.put(b"ns", {b"k": b"v" * 1000})
    now = [time.monotonic()]
    client, grpc = counted_client(v.address, clock=lambda: now[0])
    with client:
        port = client.stats().bulk_port
        with busy_bulk_connections(port, 2), caplog.at_level(logging.INFO, "tierkv.client.bulk"):
            for _ in range(3):
                assert client.get(b"ns", [b"k"]) == [b"v" * 1000]
        assert grpc.calls[BATCH_GET] == 3, "every get while the port was full went over gRPC"
        assert "refused" in caplog.text and client.bulk_port is None
        assert client.get(b"ns", [b"k"]) == [b"v" * 1000]
        assert client.bulk_port is None and grpc.calls[BATCH_GET] == 4, "not asked again within the second"
        now[0] += 1.01  # the port is asked for again a second after it refused
        assert client.get(b"ns", [b"k"]) == [b"v" * 1000]
        assert client.bulk_port == port and grpc.calls[BATCH_GET] == 4


def test_more_clients_than_bulk_connections_all_get(vault_factory: VaultFactory, tmp_path: Path) -> None:
    """Each new client pushes an idle pooled connection out; its owner's next get retries on a fresh one."""
    v = vault_with(vault_factory, tmp_path, "[vault]\nbulk_max_connections = 4\n")
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"k": b"blob"})
    clients = [VaultClient(v.address) for _ in range(12)]
    try:
        for _ in range(2):
            for c in clients:
                assert c.get(b"ns", [b"k"]) == [b"blob"]
        assert all(c.bulk_port is not None for c in clients), "a dropped pooled connection is retried"
    finally:
        for c in clients:
            c.close()


def test_a_bulk_port_that_drops_every_connection_is_retried_once_then_grpc(
    vault_factory: VaultFactory,
) -> None:
    """A real vault's gRPC, and a bulk endpoint that accepts and closes at once (a restart, a full port)."""
    v = vault_factory()
    accepted = []
    with socket.create_server(("127.0.0.1", 0)) as dropper:
        dropper.settimeout(5)
        client, grpc = counted_client(v.address)
        with client:
            client.put(b"ns", {b"k": b"v"})
            assert client.get(b"ns", [b"k"]) == [b"v"] and isinstance(client.transport, BulkFirst)
            channel = client.transport.bulk
            assert channel is not None
            channel.close()
            channel.endpoint = HostPort("127.0.0.1", dropper.getsockname()[1])

            def drop() -> None:
                for _ in range(2):
                    conn, _ = dropper.accept()
                    accepted.append(conn)
                    conn.close()

            t = threading.Thread(target=drop)
            t.start()
            assert client.get(b"ns", [b"k"]) == [b"v"]
            t.join(5)
            assert len(accepted) == 2 and grpc.calls[BATCH_GET] == 1


def test_flush_needs_a_namespace_or_all_namespaces(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with VaultClient(v.address) as c:
        c.put(b"a", {b"k": b"v"})
        c.put(b"b", {b"k": b"v", b"l": b"w"})
        with pytest.raises(ValueError, match="all_namespaces"):
            c.flush(b"")
        with pytest.raises(ValueError):
            c.flush()
        with pytest.raises(ValueError):
            c.flush(b"a", all_namespaces=True)
        assert c.stats().keys == 3
        assert c.flush(b"a") == 1
        assert c.flush(all_namespaces=True) == 2
        assert c.stats().keys == 0

    async def run() -> None:
        async with AsyncVaultClient(v.address) as ac:
            with pytest.raises(ValueError):
                await ac.flush(b"")
            await ac.put(b"c", {b"k": b"v"})
            assert await ac.flush(all_namespaces=True) == 1

    asyncio.run(run())


def test_health_and_timeouts_per_call(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with VaultClient(v.address, timeout=5.0) as c:
        assert c.health()
        c.put(b"ns", {b"k": b"v"})
        assert c.get(b"ns", [b"k"], timeout=1.0) == [b"v"]
        assert c.prefix_lookup(b"ns", [b"k", b"x"], timeout=1.0) == 1
    with VaultClient("127.0.0.1:1", timeout=0.3) as dead:
        assert not dead.health()
