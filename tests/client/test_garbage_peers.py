"""Peers that answer garbage: the client raises VaultError, and Cluster never raises (a miss).

A real vault never sends these bytes, so the peers here are fakes on purpose: a gRPC server that answers
every tierkv method with the given bytes (and may advertise a bulk port), and a plain TCP port that answers
whatever it is sent with the given bytes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from tierkv import VaultClient
from tierkv.client.cluster import Cluster
from tierkv.errors import VaultError
from tierkv.wire import SERVICE, bulk, pb

GARBAGE = [b"\x0a\x10", b"\xff" * 7, b"\x0a\x02\x12\x05", b"", b"\x12\x03abc\x0a\x01"]


class Answering(grpc.GenericRpcHandler):
    """Every tierkv method answers ``reply``; Stats may instead name a bulk port."""

    def __init__(self, reply: bytes, bulk_port: int = 0) -> None:
        self.reply = reply
        self.stats = pb.StatsReply(bulk_port=bulk_port).SerializeToString() if bulk_port else reply

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method  # type: ignore[attr-defined]
        if not method.startswith(f"/{SERVICE}/"):
            return None
        if method.endswith("/BatchGet"):
            return grpc.unary_stream_rpc_method_handler(lambda req, ctx: iter([self.reply]))
        if method.endswith("/Put"):
            return grpc.stream_unary_rpc_method_handler(lambda reqs, ctx: [*reqs, self.reply][-1])
        answer = self.stats if method.endswith("/Stats") else self.reply
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer)


def grpc_peer(handler: grpc.GenericRpcHandler) -> Callable[[], Iterator[str]]:
    def run() -> Iterator[str]:
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield f"127.0.0.1:{port}"
        finally:
            server.stop(0)

    return run


class TcpPeer:
    """A plain TCP port answering every connection with ``reply`` and then closing it."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2)
                conn.recv(65536)
                conn.sendall(self.reply)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def tcp_peer() -> Iterator[Callable[[bytes], TcpPeer]]:
    peers: list[TcpPeer] = []

    def make(reply: bytes) -> TcpPeer:
        peers.append(TcpPeer(reply))
        return peers[-1]

    yield make
    for p in peers:
        p.close()


def assert_cluster_treats_it_as_misses(address: str) -> None:
    """Gets are misses; the other calls do not raise (some garbage is a valid, empty control reply)."""
    with Cluster({"kv_cold": [address]}, timeout=1.0, breaker_threshold=100) as cluster:
        assert cluster.get(b"ns", [b"a", b"b"]) == [None, None]
        assert cluster.get_buffers(b"ns", [b"a"]) == [None]
        assert cluster.prefix_lookup(b"ns", [b"a"]) in (0, 1)
        assert cluster.put(b"ns", {b"a": b"x"}).stored == 0, "garbage never acknowledges a put"
        cluster.delete(b"ns", [b"a"])
        cluster.stats()


@pytest.mark.parametrize("reply", GARBAGE)
def test_a_grpc_peer_answering_garbage_is_a_vault_error_and_a_miss(reply: bytes) -> None:
    for address in grpc_peer(Answering(reply))():
        with VaultClient(address, timeout=1.0) as c:
            for call in (
                lambda: c.get(b"ns", [b"a"]),
                c.stats,
                lambda: c.prefix_lookup(b"ns", [b"a"]),
                lambda: c.put(b"ns", {b"a": b"x"}),
                lambda: c.flush(b"ns"),
            ):
                with contextlib.suppress(VaultError):
                    call()
            assert not c.health()
        assert_cluster_treats_it_as_misses(address)


@pytest.mark.parametrize(
    "reply",
    [
        *GARBAGE,
        bulk.record(bulk.FRAME, 2) + b"\x0a\x10",
        bulk.record(bulk.FRAME, 0xFFFFFF00),
        bulk.record(bulk.ERROR, 4) + b"\xff\xfe\x00 ",
        bulk.record(9, 0),
    ],
)
def test_a_bulk_port_answering_garbage_is_a_vault_error_and_a_miss(
    reply: bytes, tcp_peer: Callable[[bytes], TcpPeer]
) -> None:
    port = tcp_peer(reply).port
    for address in grpc_peer(Answering(b"", bulk_port=port))():
        with VaultClient(address, timeout=1.0) as c:
            outcome: Any
            try:
                outcome = c.get(b"ns", [b"a"])
            except VaultError as exc:
                outcome = exc
            # nothing at all from the bulk port is a refusal: the empty gRPC reply then answers
            assert isinstance(outcome, VaultError) or (reply == b"" and outcome == [None])
        assert_cluster_treats_it_as_misses(address)


def test_a_tcp_peer_that_is_not_grpc_is_unavailable(tcp_peer: Callable[[bytes], TcpPeer]) -> None:
    address = f"127.0.0.1:{tcp_peer(GARBAGE[0]).port}"
    with VaultClient(address, timeout=1.0) as c, pytest.raises(VaultError):
        c.get(b"ns", [b"a"])
    with Cluster({"kv_cold": [address]}, timeout=1.0) as cluster:
        assert cluster.get(b"ns", [b"a"]) == [None]
