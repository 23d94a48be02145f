"""The vault's bulk read path, two builds side by side against bare TCP: wall time and CPU time per round.

Each build (``--old``, ``--new``: source trees) gets a vault started from that tree and a worker process
that imports tierkv's client from it, so a change on either end of the wire (client or vault) is
measured. The driver sends the workers one round at a time, contenders rotated per repetition (as
:mod:`benchmarks.interleave` does), and collects per round:

- wall seconds of the round;
- CPU seconds of the worker process (the client: every thread) and of its vault (every thread, from
  ``/proc``), so a change that only moves work from one side to the other shows as such.

Rounds (``--what``): ``get`` is one ``get_buffers`` of ``--round-mib`` MiB in blobs of each ``--blob-kib``;
``restore`` is a raw restore as ``tierkv bench synthetic`` does one: a prefix lookup, then BatchGets of
16 MiB, every blob verified (header and payload checksum) and viewed as the model's values.

The bare TCP contenders send the same number of bytes over one fresh connection: ``tcp`` from one 4 MiB
buffer sent again and again into one 4 MiB receive buffer (both stay in the CPU's cache: the ceiling the
link tables quote), ``tcp_round`` from a round-sized buffer of distinct bytes into a round-sized receive
buffer (the memory a BatchGet reads from and receives into). Linux only (``/proc``).

    PYTHONPATH=$PWD python -m benchmarks.bulk_read --old /path/to/main --new . --repeats 15
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROUND_BATCH = 16 << 20
"""Bytes per BatchGet of a restore round, as ``bench synthetic --batch-mib 16``."""
BLOCK_SHAPE = (24, 2, 16, 2, 64)
"""One 16-token block of Qwen2.5-0.5B's KV in bf16 (layers, K/V, tokens, heads, head dim): 192 KiB."""


def process_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` so far: its live threads' ``schedstat`` (nanoseconds), or, where
    more, ``/proc/PID/stat``'s user and system time, which keeps the time of threads that have ended but
    counts in clock ticks (10 ms)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    return max(total / 1e9, ticks / os.sysconf("SC_CLK_TCK"))


# --- the worker: runs in the build's own tree -------------------------------------------------------


def worker() -> None:
    """Serve the driver's commands (one JSON object per line) with this tree's client, against the vault
    the driver started from the same tree (its address and PID in ``TIERKV_BULK_READ_VAULT``)."""
    from tierkv import VaultClient
    from tierkv.client.cluster import Cluster

    vault = json.loads(os.environ["TIERKV_BULK_READ_VAULT"])
    with (
        VaultClient(vault["address"], timeout=120) as client,
        Cluster({"kv_cold": [vault["address"]]}, timeout=120) as cluster,
    ):
        rounds: dict[str, Callable[[], object]] = {}
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "setup":
                rounds[f"get{cmd['blob']}"] = _get_round(client, cmd["blob"], cmd["count"])
                reply: dict[str, Any] = {"ok": True}
            elif cmd["op"] == "setup_restore":
                rounds["restore"] = restore = _restore_round(cluster, cmd["blocks"])
                reply = {"ok": restore() == cmd["blocks"]}
            else:
                reply = _timed(rounds[cmd["name"]], vault["pid"])
            print(json.dumps(reply), flush=True)


def _timed(fn: Callable[[], object], vault_pid: int) -> dict[str, float]:
    """One round: its wall time and the CPU time of this process and of the vault meanwhile."""
    v0, c0, t0 = process_cpu(vault_pid), time.process_time(), time.perf_counter()
    fn()
    t1, c1, v1 = time.perf_counter(), time.process_time(), process_cpu(vault_pid)
    return {"wall": t1 - t0, "client_cpu": c1 - c0, "vault_cpu": v1 - v0}


def _get_round(client: Any, size: int, count: int) -> Callable[[], object]:
    """Store ``count`` random blobs of ``size`` bytes; the round reads them back in one BatchGet."""
    rng = random.Random(size)
    keys = [f"{size}-{i:06d}".encode() for i in range(count)]
    for i in range(0, count, 64):
        client.put(b"get", {k: rng.randbytes(size) for k in keys[i : i + 64]})
    return lambda: client.get_buffers(b"get", keys)


def _restore_round(cluster: Any, blocks: int) -> Callable[[], int]:
    """Store ``blocks`` raw bf16 KV blocks; the round restores them as ``bench synthetic`` does (lookup,
    16 MiB gets, each blob verified and viewed), returning how many came back."""
    import numpy as np

    from tierkv.codec import Expect, decode, encode

    rng = np.random.default_rng(0)
    pool = [
        encode(
            rng.integers(0, 1 << 16, size=BLOCK_SHAPE, dtype=np.uint16), "raw", tokens=16, dtype="bfloat16"
        )
        for _ in range(8)
    ]
    keys = [f"r{i:06d}".encode() for i in range(blocks)]
    per = max(1, ROUND_BATCH // len(pool[0]))
    for i in range(0, blocks, per):
        cluster.put(
            b"restore", {k: pool[(i + j) % 8] for j, k in enumerate(keys[i : i + per])}, role="kv_cold"
        )
    expect = Expect(None, "raw", BLOCK_SHAPE, 16)

    def restore() -> int:
        present = cluster.prefix_lookup(b"restore", keys, role="kv_cold")
        done = 0
        for i in range(0, present, per):
            for blob in cluster.get_buffers(b"restore", keys[i : min(i + per, present)], role="kv_cold"):
                if blob is None:
                    return done
                decode(blob, out_dtype="bfloat16", expect=expect, copy=False)
                done += 1
        return done

    return restore


# --- the driver ---------------------------------------------------------------------------------------


class Worker:
    """One build's client in a process of its own, driven a JSON line at a time."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.proc.wait()}")
        return dict(json.loads(line))


def worker_command(
    tree: str, prefix: Sequence[str], vault: dict[str, Any]
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a worker that imports tierkv from ``tree`` (on the engine side of
    a link: ``prefix``) and reads from the vault ``vault`` names (address and PID)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(tree).resolve()),
        "TIERKV_BULK_READ_VAULT": json.dumps(vault),
    }
    return [*prefix, sys.executable, str(Path(__file__).resolve()), "--worker"], env


@dataclasses.dataclass(frozen=True)
class TcpServer:
    """A bare TCP sender (``raw_tcp``'s, or the round-sized one) that printed its port."""

    proc: subprocess.Popen[str]
    host: str

    @functools.cached_property
    def port(self) -> int:
        assert self.proc.stdout is not None
        return int(self.proc.stdout.readline())


def round_pull(host: str, port: int, nbytes: int) -> Callable[[], None]:
    """``nbytes`` from the round-sized server into one round-sized buffer, over one fresh connection."""
    buf = memoryview(bytearray(nbytes))

    def pull() -> None:
        with socket.create_connection((host, port)) as s:
            s.sendall(nbytes.to_bytes(8, "big"))
            got = 0
            while got < nbytes:
                n = s.recv_into(buf[got:])
                if not n:
                    raise RuntimeError("tcp server closed early")
                got += n

    return pull


def timed_local(fn: Callable[[], None], server_pid: int) -> dict[str, float]:
    v0, c0, t0 = process_cpu(server_pid), time.process_time(), time.perf_counter()
    fn()
    t1, c1, v1 = time.perf_counter(), time.process_time(), process_cpu(server_pid)
    return {"wall": t1 - t0, "client_cpu": c1 - c0, "vault_cpu": v1 - v0}


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _mean(rows: list[dict[str, float]], key: str) -> float:
    """CPU seconds per round: the mean (a thread that ends mid-round takes its time with it, so one round
    can read low; the mean over many does not depend on which)."""
    return statistics.fmean(r[key] for r in rows)


def _ratio(a: list[dict[str, float]], b: list[dict[str, float]], key: str) -> dict[str, float]:
    each = [x[key] / y[key] for x, y in zip(a, b, strict=True)]
    return {"median": statistics.median(each), "min": min(each), "max": max(each)}


def measure(
    contenders: dict[str, Callable[[], dict[str, float]]], repeats: int
) -> dict[str, list[dict[str, float]]]:
    """Every contender once per repetition, in an order rotated from one repetition to the next, after
    one warm-up round each."""
    for fn in contenders.values():
        fn()
    names = list(contenders)
    out: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            out[name].append(contenders[name]())
    return out


def report(title: str, nbytes: int, runs: dict[str, list[dict[str, float]]], base: str) -> dict[str, Any]:
    print(f"\n{title} ({nbytes / 2**20:.0f} MiB a round)")
    print(f"{'contender':<12} {'GB/s':>7} {'client CPU ms':>14} {'server CPU ms':>14}   rate ÷ {base}'s")
    doc: dict[str, Any] = {"bytes": nbytes, "runs": runs}
    for name, rows in runs.items():
        rate = nbytes / _median(rows, "wall") / 1e9
        r = _ratio(runs[base], rows, "wall")  # their time ÷ ours: the rate ratio
        doc[name] = {"gbps": rate, "client_cpu_ms": _mean(rows, "client_cpu") * 1e3}
        doc[name]["vault_cpu_ms"] = _mean(rows, "vault_cpu") * 1e3
        doc[name][f"rate_vs_{base}"] = r
        print(
            f"{name:<12} {rate:7.3f} {doc[name]['client_cpu_ms']:14.1f} {doc[name]['vault_cpu_ms']:14.1f}"
            f"   {r['median']:.2f}× ({r['min']:.2f}–{r['max']:.2f})"
        )
    return doc


def run(
    args: argparse.Namespace, workers: dict[str, Worker], tcp: TcpServer, tcp_round: TcpServer
) -> dict[str, Any]:
    """Every round asked for, contenders interleaved; the document of figures."""
    from benchmarks.raw_tcp import tcp_pull

    doc: dict[str, Any] = {"argv": sys.argv[1:], "load_before": os.getloadavg()}
    round_bytes = args.round_mib << 20
    what = args.what.split(",")
    for kib in [int(k) for k in args.blob_kib.split(",")] if "get" in what else []:
        size = kib * 1024
        count = max(1, round_bytes // size)
        for w in workers.values():
            w.ask(op="setup", blob=size, count=count)
        nbytes = size * count
        pull, rpull = tcp_pull(tcp.host, tcp.port), round_pull(tcp_round.host, tcp_round.port, nbytes)
        contenders: dict[str, Callable[[], dict[str, float]]] = {
            name: (lambda w=w, size=size: w.ask(op="round", name=f"get{size}")) for name, w in workers.items()
        }
        contenders["tcp"] = lambda: timed_local(lambda: pull(nbytes), tcp.proc.pid)
        contenders["tcp_round"] = lambda: timed_local(rpull, tcp_round.proc.pid)
        runs = measure(contenders, args.repeats)
        doc[f"get_{kib}k"] = report(f"get_buffers, {kib} KiB blobs", nbytes, runs, "tcp")
        if "old" in workers:
            r = _ratio(runs["old"], runs["new"], "wall")
            print(f"new ÷ old rate: {r['median']:.2f}× ({r['min']:.2f}–{r['max']:.2f})")
            doc[f"get_{kib}k"]["new_vs_old"] = r
    if "restore" in what:
        for w in workers.values():
            if not w.ask(op="setup_restore", blocks=args.restore_blocks)["ok"]:
                raise RuntimeError("the restore round did not bring back every block")
        contenders = {name: (lambda w=w: w.ask(op="round", name="restore")) for name, w in workers.items()}
        runs = measure(contenders, args.repeats)
        base = "old" if "old" in workers else "new"
        nbytes = args.restore_blocks * 192 * 1024
        doc["restore"] = report("raw restore (lookup, 16 MiB gets, verify)", nbytes, runs, base)
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--old", help="source tree of the build to compare against (e.g. main's)")
    parser.add_argument("--new", default=".", help="source tree of the build under test")
    parser.add_argument("--what", default="get,restore", help="rounds: get, restore")
    parser.add_argument("--blob-kib", default="256,1024")
    parser.add_argument("--round-mib", type=int, default=16)
    parser.add_argument("--restore-blocks", type=int, default=1024, help="blocks of 192 KiB per restore")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--link", help="RATE[,RTT] or a preset (5gbe), as tierkv bench --link; needs root")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    from benchmarks.processes import started
    from benchmarks.raw_tcp import server_command
    from tierkv.bench.link import link_emulator, parse_link
    from tierkv.vault.launcher import VaultProcess

    with contextlib.ExitStack() as stack:
        if args.link:
            link = stack.enter_context(link_emulator(parse_link(args.link)))
            host, vault_prefix, engine_prefix = link.vault_host, list(link.vault_prefix), link.engine_prefix
            stack.enter_context(link.engine_side())  # also while everything below is stopped
        else:
            host, vault_prefix, engine_prefix = "127.0.0.1", [], ()
        builds = {"new": args.new, **({"old": args.old} if args.old else {})}
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tierkv-bulkread-")))
        workers = {}
        for name, tree in builds.items():
            vault = VaultProcess(
                tmp / name,
                host=host,
                max_bytes="2GiB",
                sync="fast",
                prefix=vault_prefix,
                allow_open=bool(vault_prefix),  # the link's namespace: nothing else reaches it
                env={"PYTHONPATH": str(Path(tree).resolve())},
            ).start()
            stack.callback(vault.stop)
            assert vault.proc is not None
            command, env = worker_command(
                tree, engine_prefix, {"address": vault.address, "pid": vault.proc.pid}
            )
            workers[name] = Worker(stack.enter_context(started(command, stdin=True, env=env)))
        tcp = TcpServer(stack.enter_context(started([*vault_prefix, *server_command(host)])), host)
        round_server = [*vault_prefix, *server_command(host, args.round_mib << 20)]
        tcp_round = TcpServer(stack.enter_context(started(round_server)), host)
        doc = run(args, workers, tcp, tcp_round)
    doc["link"] = args.link or "loopback"
    doc["load_after"] = os.getloadavg()
    before, after = doc["load_before"][0], doc["load_after"][0]
    print(f"\nload average {before:.1f} before, {after:.1f} after; {os.cpu_count()} cores")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
