"""tierkv vault vs redis-server, side by side in one run, plus the raw-TCP ceiling of this machine.

Each server runs in its own process, the client in this one. For blob sizes of 256 KiB, 1 MiB and 4 MiB
and rounds of ``--round-mib`` MiB, it times tierkv ``put`` (one Put stream per round) against redis-py
``MSET`` and tierkv ``get`` (one BatchGet) against ``MGET`` (hiredis parser), and reports median GB/s and
ratios. Run ``benchmarks/setup-redis.sh`` first (``make bench-redis`` does both).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from tierkv import VaultClient, __version__
from tierkv.vault.launcher import VaultProcess

SIZES = [256 * 1024, 1024 * 1024, 4 * 1024 * 1024]

TCP_SERVER = r"""
import socket, sys
total = int(sys.argv[1]); chunk = memoryview(bytearray(4 << 20))
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    if conn.recv(1) != b"g":
        break
    left = total
    while left:
        n = min(left, len(chunk)); conn.sendall(chunk[:n]); left -= n
    conn.close()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(fn: Callable[[], object], nbytes: int, repeats: int) -> float:
    """Median GB/s over ``repeats`` runs (after one warm-up run)."""
    fn()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        rates.append(nbytes / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def tcp_ceiling(nbytes: int, repeats: int) -> float:
    proc = subprocess.Popen(
        [sys.executable, "-c", TCP_SERVER, str(nbytes)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    buf = memoryview(bytearray(4 << 20))

    def pull() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"g")
            left = nbytes
            while left:
                got = s.recv_into(buf, min(left, len(buf)))
                if not got:
                    raise RuntimeError("tcp server closed early")
                left -= got

    try:
        return timed(pull, nbytes, repeats)
    finally:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"x")
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--round-mib", type=int, default=128, help="bytes per round (64-256 MiB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    if not shutil.which("redis-server"):
        sys.exit("redis-server not found: run benchmarks/setup-redis.sh first")
    round_bytes = args.round_mib * 1024 * 1024
    work = Path(tempfile.mkdtemp(prefix="tierkv-bench-"))
    redis_port = free_port()
    redis_proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            "--dir",
            str(work),
        ],
        stdout=subprocess.DEVNULL,
    )
    vaults = {
        mode: VaultProcess(work / f"vault-{mode}", max_bytes="4GiB", sync=mode).start()
        for mode in ("fast", "durable")
    }
    results: list[dict[str, object]] = []
    try:
        r = redis.Redis(port=redis_port, socket_timeout=60)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        tcp = tcp_ceiling(round_bytes, args.repeats)
        for size in SIZES:
            n = round_bytes // size
            keys = [f"blk{i:06d}".encode() for i in range(n)]
            blobs = {k: os.urandom(size) for k in keys}
            row: dict[str, object] = {"blob_bytes": size, "blobs_per_round": n, "round_bytes": n * size}
            row["redis_mset"] = timed(lambda: r.mset(blobs), n * size, args.repeats)
            row["redis_mget"] = timed(lambda: r.mget(keys), n * size, args.repeats)
            for mode, vp in vaults.items():
                with VaultClient(vp.address, timeout=60) as c:
                    row[f"tierkv_put_{mode}"] = timed(lambda: c.put(b"bench", blobs), n * size, args.repeats)
                    if mode == "fast":
                        assert c.get(b"bench", keys[:3]) == [blobs[k] for k in keys[:3]]
                        row["tierkv_get"] = timed(lambda: c.get(b"bench", keys), n * size, args.repeats)
                        row["tierkv_get_buffers"] = timed(
                            lambda: c.get_buffers(b"bench", keys), n * size, args.repeats
                        )
            r.flushall()
            results.append(row)
    finally:
        for vp in vaults.values():
            vp.stop()
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    redis_version = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"\ntierkv {__version__} vs {redis_version}; {platform.machine()}, {os.cpu_count()} cores; "
        f"{args.round_mib} MiB per round, median of {args.repeats}; raw TCP loopback ceiling {tcp:.2f} GB/s\n"
    )
    print(
        "| blob | tierkv BatchGet | Redis MGET | ratio | tierkv Put (fast) | tierkv Put (durable) | Redis MSET "
        "| ratio (fast) | BatchGet / TCP |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in results:
        size = int(row["blob_bytes"])  # type: ignore[call-overload]
        get, mget = float(row["tierkv_get"]), float(row["redis_mget"])  # type: ignore[arg-type]
        put, putd, mset = (float(row[k]) for k in ("tierkv_put_fast", "tierkv_put_durable", "redis_mset"))  # type: ignore[arg-type]
        label = f"{size // 1024} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
        print(
            f"| {label} | {get:.2f} GB/s | {mget:.2f} GB/s | {get / mget:.2f}× | {put:.2f} GB/s | {putd:.2f} GB/s "
            f"| {mset:.2f} GB/s | {put / mset:.2f}× | {get / tcp:.0%} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"tcp_ceiling": tcp, "redis": redis_version, "rows": results}, indent=2)
        )


if __name__ == "__main__":
    main()
