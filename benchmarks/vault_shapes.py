"""One tenant's shape against another tenant's Puts, on two vault builds (``--old``, ``--new`` source
trees), sittings alternated.

- ``children``: tenant alpha stores a parent block with ``--children`` children and then asks for its
  successors from ``--threads`` threads (at most ``--calls`` each, at most ``--seconds``); meanwhile
  tenant beta stores ``--puts`` chained blocks of 64 KiB one Put at a time. Reported: beta's Put latency
  (p50, p99, max) and alpha's Successors latency (median).
- ``hottest``: a chain of ``--depth`` blocks with 1,024 leaves on its last block (keys of 60 bytes);
  ``Hottest(limit=1024)``: its time, reply bytes and whether it was truncated, or the error.

    python benchmarks/vault_shapes.py --old /path/to/old/tree --new . [--repeats 2]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time

import grpc

from benchmarks.two_builds import alternated, two_builds
from tierkv import VaultClient
from tierkv.retention import BlockMeta
from tierkv.vault.launcher import VaultProcess
from tierkv.wire import SERVICE, pb

NS = b"shapes"


def _ident(b: bytes) -> bytes:
    return b


def children(vault: VaultProcess, args: argparse.Namespace, rep: int) -> str:
    stop = threading.Event()
    succ_s: list[float] = []

    def ask() -> None:
        end = time.monotonic() + args.seconds
        with VaultClient(vault.address, token="tok-a", timeout=30) as alpha:
            for _ in range(args.calls):
                if stop.is_set() or time.monotonic() > end:
                    return
                start = time.perf_counter()
                alpha.successors(NS, [b"parent"], max_keys=64)
                succ_s.append(time.perf_counter() - start)

    threads = [threading.Thread(target=ask) for _ in range(args.threads)]
    for t in threads:
        t.start()
    put_s = []
    blob = b"b" * (64 << 10)
    try:
        with VaultClient(vault.address, token="tok-b", timeout=30) as beta:
            for i in range(args.puts):
                key = b"r%d-%d" % (rep, i)
                meta = {key: BlockMeta(parent=b"r%d-%d" % (rep, i - 1) if i else b"")}
                start = time.perf_counter()
                beta.put(NS, {key: blob}, meta=meta)
                put_s.append(time.perf_counter() - start)
    finally:
        stop.set()
        for t in threads:
            t.join()
    q = statistics.quantiles(put_s, n=100, method="inclusive")
    succ = f"{1000 * statistics.median(succ_s):.0f} ms ({len(succ_s)} calls)" if succ_s else "none"
    return (
        f"beta Put p50 {1000 * statistics.median(put_s):.1f} ms, p99 {1000 * q[98]:.0f} ms,"
        f" max {1000 * max(put_s):.0f} ms; alpha Successors median {succ}"
    )


def hottest(vault: VaultProcess) -> str:
    request = pb.HottestRequest(namespace=b"deep", limit=1024).SerializeToString()
    with grpc.insecure_channel(vault.address, options=[("grpc.max_receive_message_length", 1 << 30)]) as ch:
        call = ch.unary_unary(f"/{SERVICE}/Hottest", _ident, _ident)
        start = time.perf_counter()
        try:
            raw = call(request, timeout=120, metadata=[("authorization", "Bearer tok-a")])
        except grpc.RpcError as exc:
            return f"{time.perf_counter() - start:.2f} s, {exc.code().name}: {(exc.details() or '')[:80]}"
        took = time.perf_counter() - start
    reply = pb.HottestReply.FromString(raw)
    flag = "truncated" if getattr(reply, "truncated", False) else "whole"
    return f"{took:.2f} s, {len(raw) / 1e6:.1f} MB, {len(reply.chains)} chains, {flag}"


def setup(vault: VaultProcess, args: argparse.Namespace) -> None:
    with VaultClient(vault.address, token="tok-a", timeout=300) as alpha:
        alpha.put(NS, {b"parent": b"p"}, meta={b"parent": BlockMeta()})
        kids = {b"c%06d" % i: b"x" for i in range(args.children)}
        alpha.put(NS, kids, meta={k: BlockMeta(parent=b"parent") for k in kids})
        alpha.get(NS, [b"parent", b"c000042"])
        trunk = [b"t%059d" % i for i in range(args.depth)]
        leaves = [b"l%059d" % i for i in range(1024)]
        metas = {trunk[0]: BlockMeta()}
        metas.update({k: BlockMeta(parent=p) for p, k in itertools.pairwise(trunk)})
        metas.update({k: BlockMeta(parent=trunk[-1]) for k in leaves})
        alpha.put(b"deep", {k: b"v" for k in metas}, meta=metas)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--children", type=int, default=50_000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--puts", type=int, default=60)
    ap.add_argument("--depth", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    with two_builds(args.old, args.new, max_bytes="1GiB") as vaults:
        for v in vaults.values():
            setup(v, args)
        for rep, name in alternated(args.repeats):
            print(f"{name} children: {children(vaults[name], args, rep)}", flush=True)
            print(f"{name} Hottest(limit=1024): {hottest(vaults[name])}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
