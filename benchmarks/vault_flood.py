"""One tenant floods a shared vault with leased lookups; how do health checks and another tenant's Puts
fare? Two vault builds (``--old``, ``--new`` source trees), sittings alternated.

Each vault has two user tenants (alpha floods, beta stores). A sitting starts ``--connections`` flooding
threads, each with a gRPC connection of its own, each doing at most ``--calls`` leased PrefixLookups of
``--keys`` keys (and stopping after ``--seconds``), spread over ``--processes`` processes; meanwhile beta Puts ``--puts`` blobs of 64 KiB one
after the other and a health check goes out before each Put. Reported per build: beta's Put latency
(p50, p99, max) and failures, health checks answered SERVING / failed, and the flood's outcome counts.

    python benchmarks/vault_flood.py --old /path/to/old/tree --new . [--repeats 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import statistics
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.two_builds import alternated, two_builds
from tierkv import VaultClient
from tierkv.vault.launcher import VaultProcess
from tierkv.wire import SERVICE, pb


def _ident(b: bytes) -> bytes:
    return b


def flood_process(address: str, request: bytes, threads: int, calls: int, seconds: float) -> dict[str, int]:
    """One flooding process: ``threads`` connections doing leased lookups (in a process of its own, so
    that beta's client does not share an interpreter lock with the flood)."""
    flood: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def flooder() -> None:
        with grpc.insecure_channel(address) as ch:
            call = ch.unary_unary(f"/{SERVICE}/PrefixLookup", _ident, _ident)
            for _ in range(calls):
                if time.monotonic() > end:
                    return
                try:
                    call(request, timeout=10, metadata=[("authorization", "Bearer tok-a")])
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                with lock:
                    flood[code] += 1

    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(flooder) for _ in range(threads)]:
            f.result()
    return dict(flood)


def sitting(vault: VaultProcess, args: argparse.Namespace) -> dict[str, object]:
    keys = [b"%06d" % i for i in range(args.keys)]
    request = pb.PrefixLookupRequest(namespace=b"ns", keys=keys, lease_ms=5000).SerializeToString()
    flood: collections.Counter[str] = collections.Counter()
    put_s: list[float] = []
    put_failed = health_ok = health_failed = 0
    procs = args.processes
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        running = [
            pool.submit(
                flood_process, vault.address, request, args.connections // procs, args.calls, args.seconds
            )
            for _ in range(procs)
        ]
        time.sleep(2.0)  # let the flood build up (the processes start first)
        with (
            VaultClient(vault.address, token="tok-b", timeout=10) as beta,
            grpc.insecure_channel(vault.address) as hch,
        ):
            stub = health_pb2_grpc.HealthStub(hch)
            blob = os.urandom(64 << 10)
            for i in range(args.puts):
                try:
                    ok = stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
                except grpc.RpcError:
                    ok = False
                health_ok += ok
                health_failed += not ok
                start = time.perf_counter()
                try:
                    stored = beta.put(b"beta", {b"k%d" % i: blob})
                except Exception:
                    stored = 0
                put_s.append(time.perf_counter() - start)
                put_failed += stored != 1
        for f in running:
            flood.update(f.result())
    q = statistics.quantiles(put_s, n=100, method="inclusive")
    return {
        "put_p50_ms": 1000 * statistics.median(put_s),
        "put_p99_ms": 1000 * q[98],
        "put_max_ms": 1000 * max(put_s),
        "put_failed": put_failed,
        "health_ok": health_ok,
        "health_failed": health_failed,
        "flood": dict(flood),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument(
        "--processes", type=int, default=4, help="flooding processes (connections split among them)"
    )
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--puts", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workers", type=int, default=16, help="[vault] workers of both vaults")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results: dict[str, list[dict[str, object]]] = {"old": [], "new": []}
    vault_toml = f"[vault]\nworkers = {args.workers}\n"
    with two_builds(args.old, args.new, max_bytes="256MiB", vault_toml=vault_toml) as vaults:
        for v in vaults.values():
            with VaultClient(v.address, token="tok-a", timeout=30) as alpha:
                alpha.put(b"ns", {b"%06d" % i: b"x" for i in range(args.keys)})
        for _, name in alternated(args.repeats):
            results[name].append(sitting(vaults[name], args))
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for name, sittings in results.items():
        for s in sittings:
            print(
                f"{name}: beta Put p50 {s['put_p50_ms']:.0f} ms, p99 {s['put_p99_ms']:.0f} ms,"
                f" max {s['put_max_ms']:.0f} ms, {s['put_failed']} failed; health {s['health_ok']} ok,"
                f" {s['health_failed']} failed; flood {s['flood']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
