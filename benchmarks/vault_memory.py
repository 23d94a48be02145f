"""A real vault's memory (RSS, split into anonymous and file-backed) and ``data.mdb`` size under the loads
that used to grow it: large valid Puts into a small vault, and senders that declare bodies they never
finish.

Scenarios (each with a fresh vault, 64 MiB budget unless ``--budget``):

- ``large-bulk`` / ``large-grpc``: ``--puts`` Puts of ``--put-mib`` MiB (1 MiB blobs) over the bulk port
  or over gRPC; RSS right after the last one and after ``--idle`` seconds without calls.
- ``stalled`` (``stalled-bulk``, ``stalled-grpc``: one transport only): ``--senders`` bulk connections
  and as many gRPC streams each send ``--stall-mib`` MiB of a
  Put and then stop (never finishing it); RSS while they hang, then after they are closed and ``--idle``
  seconds have passed.

Run:

    python benchmarks/vault_memory.py [--scenario large-bulk,large-grpc,stalled] [--idle 10] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from tierkv import VaultClient
from tierkv.config import parse_size
from tierkv.vault.launcher import VaultProcess
from tierkv.wire import SERVICE, Blob, bulk, encode_frames, pb

MiB = 1 << 20


def memory(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of ``pid`` in MiB (from /proc)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def mdb_mib(vault: VaultProcess) -> float:
    return (vault.path / "data.mdb").stat().st_size / MiB


def large(vault: VaultProcess, *, transport: str, puts: int, put_mib: int, idle: float) -> dict[str, object]:
    pid = _pid(vault)
    out: dict[str, object] = {"start": memory(pid)}
    blob = os.urandom(MiB)
    with VaultClient(vault.address, timeout=120, bulk=transport == "bulk") as c:
        for p in range(puts):
            stored = c.put(b"big", {b"%d-%d" % (p, i): blob for i in range(put_mib)})
            out[f"put{p}_stored"] = stored
        out["after_puts"] = memory(pid)
        time.sleep(idle)
        out[f"after_{idle:g}s_idle"] = memory(pid)
        out["used_mib"] = c.stats().used_bytes / MiB
    out["data_mdb_mib"] = mdb_mib(vault)
    return out


def _bulk_port(vault: VaultProcess) -> int:
    with grpc.insecure_channel(vault.address) as ch:
        call = ch.unary_unary(f"/{SERVICE}/Stats", _ident, _ident)
        return int(pb.StatsReply.FromString(call(b"", timeout=10)).bulk_port)


def _ident(b: bytes) -> bytes:
    return b


def _frames(n_mib: int, tag: int) -> list[bytes]:
    blobs = [Blob(key=b"s%d-%d" % (tag, i), data=os.urandom(MiB)) for i in range(n_mib)]
    return list(encode_frames(blobs, frame_bytes=4 * MiB, namespace=b"stall"))


@contextlib.contextmanager
def stalled_senders(
    vault: VaultProcess, bulk_senders: int, grpc_senders: int, stall_mib: int
) -> Iterator[dict[str, int]]:
    """Bulk connections and gRPC streams that each send ``stall_mib`` MiB of a Put (the bulk ones declare
    one more frame than they send) and hang until the block exits."""
    port = _bulk_port(vault)
    release = threading.Event()
    socks: list[socket.socket] = []
    counts = {"bulk_sent": 0, "grpc_streams": 0, "refused": 0}
    frames = _frames(stall_mib, 0)
    for _ in range(bulk_senders):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        socks.append(s)
        try:
            s.sendall(bulk.request_head(None, bulk.OP_PUT))
            for f in frames:
                s.sendall(bulk.record(bulk.FRAME, len(f)) + f)
            s.sendall(bulk.record(bulk.FRAME, 64 * MiB - 1) + b"x" * MiB)  # declared, never finished
            counts["bulk_sent"] += 1
        except OSError:
            counts["refused"] += 1
    channel = grpc.insecure_channel(vault.address, options=[("grpc.max_send_message_length", 64 * MiB)])
    call = channel.stream_unary(f"/{SERVICE}/Put", _ident, _ident)

    def hang() -> Iterator[bytes]:
        yield from frames
        release.wait(120)

    futures = [call.future(hang(), timeout=120) for _ in range(grpc_senders)]
    counts["grpc_streams"] = len(futures)
    try:
        yield counts
    finally:
        release.set()
        for s in socks:
            s.close()
        for f in futures:
            f.cancel()
        channel.close()


def stalled(
    vault: VaultProcess, *, bulk_senders: int, grpc_senders: int, stall_mib: int, idle: float
) -> dict[str, object]:
    pid = _pid(vault)
    out: dict[str, object] = {"start": memory(pid)}
    with stalled_senders(vault, bulk_senders, grpc_senders, stall_mib) as counts:
        time.sleep(3)  # the vault receives what was sent
        out["while_stalled"] = memory(pid)
        out.update(counts)
        with VaultClient(vault.address, timeout=30) as c:
            try:
                out["other_put_stored"] = c.put(b"other", {b"k": os.urandom(MiB)})
            except Exception as exc:  # a refusal is a figure here, not a failure of the benchmark
                out["other_put_error"] = type(exc).__name__
    time.sleep(idle)
    out[f"after_close_{idle:g}s_idle"] = memory(pid)
    return out


def _pid(vault: VaultProcess) -> int:
    assert vault.proc is not None
    return vault.proc.pid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="large-bulk,large-grpc,stalled")
    ap.add_argument("--budget", default="64MiB")
    ap.add_argument("--puts", type=int, default=4)
    ap.add_argument("--put-mib", type=int, default=160)
    ap.add_argument("--senders", type=int, default=16)
    ap.add_argument("--stall-mib", type=int, default=48)
    ap.add_argument("--idle", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="tierkv-mem-") as tmp:
        for name in args.scenario.split(","):
            vault = VaultProcess(Path(tmp) / name, max_bytes=parse_size(args.budget), sync="fast").start()
            try:
                if name.startswith("large-"):
                    results[name] = large(
                        vault, transport=name[6:], puts=args.puts, put_mib=args.put_mib, idle=args.idle
                    )
                elif name.startswith("stalled"):
                    kinds = name.split("-")[1:] or ["bulk", "grpc"]
                    results[name] = stalled(
                        vault,
                        bulk_senders=args.senders if "bulk" in kinds else 0,
                        grpc_senders=args.senders if "grpc" in kinds else 0,
                        stall_mib=args.stall_mib,
                        idle=args.idle,
                    )
                else:
                    print(f"unknown scenario {name!r}", file=sys.stderr)
                    return 2
            finally:
                vault.stop()
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for name, r in results.items():
            print(name)
            for k, v in r.items():  # type: ignore[attr-defined]
                text = ", ".join(f"{a} {b:.0f}" for a, b in v.items()) if isinstance(v, dict) else v
                print(f"  {k}: {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
