"""The bulk port under load from real peers: a slow reader must not stall writers or health; idle
connections beyond the cap make room instead of refusing a newcomer."""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import VaultFactory
from tests.vault.rawcalls import bulk_records, put, read_records, stats
from tierkv.wire import bulk, pb


def batch_get_request(namespace: bytes, keys: list[bytes]) -> bytes:
    return bulk.encode_request(None, pb.BatchGetRequest(namespace=namespace, keys=keys).SerializeToString())


def slow_read(port: int, request: bytes, stop: threading.Event, rate: int = 64 * 1024) -> int:
    """Ask for a large reply and read it at about ``rate`` bytes/s until ``stop`` (bounded by it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    got = 0
    try:
        sock.sendall(request)
        while not stop.is_set():
            chunk = sock.recv(rate // 8)
            if not chunk:
                break
            got += len(chunk)
            stop.wait(1 / 8)
    finally:
        sock.close()
    return got


def test_a_slow_bulk_reader_stalls_neither_puts_nor_health(vault_factory: VaultFactory) -> None:
    v = vault_factory(max_bytes="16MiB", sync="fast")
    blob = 1 << 20
    with grpc.insecure_channel(v.address) as ch:
        big = {f"big{i}".encode(): os.urandom(blob) for i in range(8)}
        put(ch, b"ns", big)
        port = stats(ch).bulk_port
        stop = threading.Event()
        reader = threading.Thread(
            target=slow_read, args=(port, batch_get_request(b"ns", list(big)), stop), daemon=True
        )
        reader.start()
        time.sleep(0.5)  # the reader's request reaches the vault and its answer starts (a socket, no timer)
        latencies, failures, health_failures = [], 0, 0
        health = health_pb2_grpc.HealthStub(ch)
        payload = os.urandom(blob)
        try:
            # 160 MiB of churn, far past LMDB's first map size for this budget; bounded in time by the
            # calls' own deadlines (a slow machine runs slow instead of failing on a wall-clock limit)
            for i in range(160):
                start = time.monotonic()
                try:
                    put(ch, b"churn", {f"c{i}".encode(): payload}, timeout=5)
                    latencies.append(time.monotonic() - start)
                except grpc.RpcError:
                    failures += 1
                if i % 10 == 0:
                    try:
                        health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    except grpc.RpcError:
                        health_failures += 1
                if failures > 5:
                    break
        finally:
            stop.set()
            reader.join(15)
    footprint = (v.path / "data.mdb").stat().st_size
    p50, worst = statistics.median(latencies or [0]) * 1e3, max(latencies or [0]) * 1e3
    print(f"\ndata.mdb {footprint >> 20} MiB; {len(latencies)} puts ok, {failures} failed, ", end="")
    print(f"{health_failures} health failures; put p50 {p50:.1f} ms, max {worst:.1f} ms")
    assert failures == 0 and health_failures == 0
    assert len(latencies) == 160
    # the reader held no snapshot for long, so LMDB reused freed pages instead of growing past the churn
    assert footprint < 80 << 20


def test_many_idle_bulk_connections_do_not_lock_out_a_new_client(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with grpc.insecure_channel(v.address) as ch:
        put(ch, b"ns", {b"k": b"v"})
        port = stats(ch).bulk_port
    request = batch_get_request(b"ns", [b"k"])
    with idle_connections(port, request, 100) as idle:
        assert bulk_records(port, request)[-1][0] == bulk.END
        for s in idle[:5]:  # the old connections still work too
            s.sendall(request)
            assert read_records(s)[-1][0] == bulk.END


def test_at_the_cap_the_longest_idle_connection_makes_room(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    cfg = tmp_path / "cap.toml"
    cfg.write_text("[vault]\nbulk_max_connections = 8\n")
    v = vault_factory(extra_args=["--config", str(cfg)])
    with grpc.insecure_channel(v.address) as ch:
        put(ch, b"ns", {b"k": b"v"})
        port = stats(ch).bulk_port
    request = batch_get_request(b"ns", [b"k"])
    with idle_connections(port, request, 8) as idle:
        for _ in range(3):
            assert bulk_records(port, request)[-1][0] == bulk.END
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b"", "the longest-idle connection was closed to make room"


@contextmanager
def idle_connections(port: int, request: bytes, n: int) -> Iterator[list[socket.socket]]:
    """``n`` bulk connections that each got one answer and then stay open, idle; closed on the way out."""
    idle: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            idle.append(s)
            s.sendall(request)
            assert read_records(s)[-1][0] == bulk.END
        yield idle
    finally:
        for s in idle:
            s.close()
