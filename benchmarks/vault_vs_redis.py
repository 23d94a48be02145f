"""tierkv vault vs redis-server, side by side in one run, plus the raw-TCP ceiling of this machine.

Each server runs in its own process, the client in this one. For blob sizes of 256 KiB, 1 MiB and 4 MiB
and rounds of ``--round-mib`` MiB, it times tierkv ``put`` (one Put per round over the bulk port, a fast
and a durable vault, and the fast vault's Put over gRPC, as it went before Put moved to the bulk port) against redis-py
``MSET``, tierkv ``get`` / ``get_buffers`` (one BatchGet) against ``MGET``
(hiredis parser), and a raw TCP pull of the same bytes. ``--dir`` puts the vaults' LMDB files somewhere
else than the system's temporary directory: ``/dev/shm`` keeps a disk's writeback out of the Put figures,
as Redis (no persistence here) and Mooncake Store (RAM) keep it out of theirs.

The contenders are interleaved: every repetition runs each of them once, in an order rotated from one
repetition to the next, so a burst of outside load on a shared machine hits all of them instead of
one. Rates are medians over the repetitions; ratios are the medians of the per-repetition ratios (each
taken between runs seconds apart), not ratios of medians. Run ``benchmarks/setup-redis.sh`` first
(``make bench-redis`` does both).
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from benchmarks.interleave import interleaved
from benchmarks.raw_tcp import server_command, stop_server, tcp_pull
from tierkv import VaultClient, __version__
from tierkv.vault.launcher import VaultProcess

SIZES = [256 * 1024, 1024 * 1024, 4 * 1024 * 1024]
RATIOS = {
    "get_vs_mget": ("tierkv_get", "redis_mget"),
    "get_buffers_vs_mget": ("tierkv_get_buffers", "redis_mget"),
    "put_fast_vs_mset": ("tierkv_put_fast", "redis_mset"),
    "put_durable_vs_mset": ("tierkv_put_durable", "redis_mset"),
    "put_bulk_vs_grpc": ("tierkv_put_fast", "tierkv_put_fast_grpc"),
    "get_vs_tcp": ("tierkv_get", "tcp"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tcp_server() -> Iterator[Callable[[int], None]]:
    """A process that sends N bytes to whoever asks; yields ``pull(N)``, the raw-TCP contender."""
    proc = subprocess.Popen(server_command("127.0.0.1"), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    try:
        yield tcp_pull("127.0.0.1", port)
    finally:
        stop_server("127.0.0.1", port)
        proc.wait(10)


@contextlib.contextmanager
def redis_server(work: Path) -> Iterator[redis.Redis]:
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        ["redis-server", *args, "--protected-mode", "yes", "--dir", str(work)], stdout=subprocess.DEVNULL
    )
    try:
        r = redis.Redis(port=port, socket_timeout=60)
        for _ in range(100):
            with contextlib.suppress(redis.ConnectionError):
                r.ping()
                break
            time.sleep(0.05)
        yield r
    finally:
        proc.terminate()
        proc.wait(10)


def summarize(size: int, n: int, rates: dict[str, list[float]]) -> dict[str, Any]:
    """Median rates, and the median over repetitions of each repetition's ratio."""
    row: dict[str, Any] = {"blob_bytes": size, "blobs_per_round": n, "round_bytes": n * size}
    row |= {name: statistics.median(values) for name, values in rates.items()}
    for ratio, (a, b) in RATIOS.items():
        row[ratio] = statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))
    row["runs"] = rates
    return row


def measure_size(
    size: int,
    round_bytes: int,
    repeats: int,
    r: redis.Redis,
    vaults: dict[str, VaultClient],
    pull: Callable[[int], None],
) -> dict[str, Any]:
    n = round_bytes // size
    keys = [f"blk{i:06d}".encode() for i in range(n)]
    blobs = {k: os.urandom(size) for k in keys}
    fast, durable = vaults["fast"], vaults["durable"]
    contenders: dict[str, Callable[[], object]] = {
        "redis_mset": lambda: r.mset(blobs),
        "tierkv_put_fast": lambda: fast.put(b"bench", blobs),
        "tierkv_put_durable": lambda: durable.put(b"bench", blobs),
        "tierkv_put_fast_grpc": lambda: vaults["fast_grpc"].put(b"bench", blobs),
        "redis_mget": lambda: r.mget(keys),
        "tierkv_get": lambda: fast.get(b"bench", keys),
        "tierkv_get_buffers": lambda: fast.get_buffers(b"bench", keys),
        "tcp": lambda: pull(n * size),
    }
    rates = interleaved(contenders, n * size, repeats)
    assert fast.get(b"bench", keys[:3]) == [blobs[k] for k in keys[:3]]
    assert r.mget(keys[:3]) == [blobs[k] for k in keys[:3]]
    r.flushall()
    return summarize(size, n, rates)


def print_table(rows: list[dict[str, Any]], header: str) -> None:
    print(f"\n{header}\n")
    print(
        "| blob | tierkv BatchGet | Redis MGET | ratio | tierkv Put (fast) | tierkv Put (durable) | Redis MSET "
        "| ratio (fast) | ratio (durable) | BatchGet / raw TCP |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        size = row["blob_bytes"]
        label = f"{size // 1024} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
        print(
            f"| {label} | {row['tierkv_get']:.2f} GB/s | {row['redis_mget']:.2f} GB/s | {row['get_vs_mget']:.2f}× "
            f"| {row['tierkv_put_fast']:.2f} GB/s | {row['tierkv_put_durable']:.2f} GB/s "
            f"| {row['redis_mset']:.2f} GB/s | {row['put_fast_vs_mset']:.2f}× | {row['put_durable_vs_mset']:.2f}× "
            f"| {row['get_vs_tcp']:.0%} |"
        )
    print(
        "\nget_buffers (zero-copy views) vs MGET: "
        + ", ".join(f"{r['get_buffers_vs_mget']:.2f}×" for r in rows)
    )
    print("raw TCP loopback: " + ", ".join(f"{r['tcp']:.2f} GB/s" for r in rows))
    print(
        "Put (fast) over gRPC: "
        + ", ".join(f"{r['tierkv_put_fast_grpc']:.2f} GB/s" for r in rows)
        + "; bulk Put / gRPC Put: "
        + ", ".join(f"{r['put_bulk_vs_grpc']:.2f}×" for r in rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--round-mib", type=int, default=128, help="bytes per round (64-256 MiB)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repetitions per blob size")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--dir", type=Path, help="where the vaults keep their files (e.g. /dev/shm)")
    args = parser.parse_args()
    if not shutil.which("redis-server"):
        sys.exit("redis-server not found: run benchmarks/setup-redis.sh first")
    round_bytes = args.round_mib * 1024 * 1024
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tierkv-bench-", dir=args.dir)))
        r = stack.enter_context(redis_server(work))
        pull = stack.enter_context(tcp_server())
        started = {
            mode: stack.enter_context(VaultProcess(work / f"vault-{mode}", max_bytes="4GiB", sync=mode))
            for mode in ("fast", "durable")
        }
        vaults = {
            mode: stack.enter_context(VaultClient(v.address, timeout=60)) for mode, v in started.items()
        }
        vaults["fast_grpc"] = stack.enter_context(
            VaultClient(started["fast"].address, timeout=60, bulk=False)
        )
        rows = [measure_size(size, round_bytes, args.repeats, r, vaults, pull) for size in SIZES]
    redis_version = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True
    ).stdout.strip()
    print_table(
        rows,
        f"tierkv {__version__} vs {redis_version}; {platform.machine()}, {os.cpu_count()} cores; "
        f"{args.round_mib} MiB per round; {args.repeats} interleaved repetitions: median rates, "
        f"medians of per-repetition ratios; vault files in {args.dir or tempfile.gettempdir()}",
    )
    if args.json:
        args.json.write_text(
            json.dumps({"redis": redis_version, "repeats": args.repeats, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
