"""tierkv over the links users have (1, 5, 10, 25 GbE, or loopback), against the peers they would pick.

For each link (``--links 1gbe 5gbe 10gbe 25gbe loopback``; ``RATE[,RTT]`` as ``tierkv bench --link``
takes it, e.g. ``5gbit,1ms``) a child process of this script sets the link up (:mod:`tierkv.bench.link`: the servers in one
network namespace, this side in another, a veth shaped with htb between them; loopback: no emulation),
measures, and tears it down, so every link starts from fresh namespaces and fresh gRPC threads. In it:

- reads of ``--round-mib`` MiB in blobs of each ``--blob-kib`` size, interleaved per repetition: tierkv
  ``get_buffers`` (one BatchGet over the bulk port), Redis ``MGET`` (redis-py with hiredis), Mooncake
  Store's ``batch_get_into`` (where ``benchmarks/setup-mooncake.sh`` built it) and a bare TCP transfer of
  the same bytes (the wire's ceiling on this machine), each after one round trip of the link;
- writes of the same rounds in blobs of each ``--put-blob-kib`` size, fresh keys every call: tierkv Puts
  into a durable vault (fsync before the answer) and a fast one, and Mooncake's ``put_batch`` (RAM);
- ``tierkv bench synthetic`` restores (raw; int8 decoded while the rest arrives; int8 decoded after each
  batch arrived), interleaved per repetition, at ``--tokens`` prompt lengths.

Rates are medians over repetitions; ratios are medians of per-repetition ratios, with their spread (min to
max) as the noise this machine added. Needs root (namespaces, tc) for anything but loopback, and
redis-server (``benchmarks/setup-redis.sh``). Every child is bounded by ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from rich.console import Console

from benchmarks import mooncake_store as mooncake
from benchmarks.interleave import interleaved
from benchmarks.processes import free_port, started
from benchmarks.raw_tcp import server_command, tcp_pull
from tierkv import VaultClient, __version__
from tierkv.bench.link import LinkSpec, link_emulator, parse_link
from tierkv.bench.shapes import parse_shape
from tierkv.bench.synthetic import SyntheticSettings, run_synthetic
from tierkv.bench.vaults import VaultSettings
from tierkv.config import config_from_dict
from tierkv.vault.launcher import VaultProcess

REDIS_PORT = 6391
READS = {
    "get_buffers_vs_mget": ("tierkv_get_buffers", "redis_mget"),
    "get_buffers_vs_mooncake": ("tierkv_get_buffers", "mooncake_get_into"),
    "get_buffers_vs_tcp": ("tierkv_get_buffers", "tcp"),
}
WRITES = {
    "durable_vs_mooncake": ("tierkv_put_durable", "mooncake_put_batch"),
    "fast_vs_mooncake": ("tierkv_put_fast", "mooncake_put_batch"),
}


def ratios(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Median, min and max of the per-repetition ratios ``a / b``."""
    each = [x / y for x, y in zip(a, b, strict=True)]
    return {"median": statistics.median(each), "min": min(each), "max": max(each)}


def measure_reads(
    size: int,
    round_bytes: int,
    repeats: int,
    vault: VaultClient,
    r: redis.Redis,
    pull: Callable[[int], None],
    rtt: Callable[[], None],
    mc: mooncake.MooncakeClient | None,
) -> dict[str, Any]:
    n = max(1, round_bytes // size)
    keys = [f"blk{i:06d}".encode() for i in range(n)]
    blobs = {k: os.urandom(size) for k in keys}
    if vault.put(b"bench", blobs) != n:
        raise SystemExit(f"the vault stored fewer than {n} blobs of {size} bytes")
    r.mset(blobs)

    def timed(fn: Callable[[], object]) -> Callable[[], object]:
        def call() -> object:
            rtt()
            return fn()

        return call

    contenders: dict[str, Callable[[], object]] = {
        "tierkv_get_buffers": timed(lambda: vault.get_buffers(b"bench", keys)),
        "redis_mget": timed(lambda: r.mget(keys)),
        "tcp": lambda: pull(n * size),
    }
    if mc is not None:
        mc.call("load", size, n)
        contenders["mooncake_get_into"] = timed(lambda: mc.call("get", size, n))
    rates = interleaved(contenders, n * size, repeats)
    assert [bytes(b) for b in vault.get_buffers(b"bench", keys[:3]) if b is not None] == [
        blobs[k] for k in keys[:3]
    ]
    assert r.mget(keys[:3]) == [blobs[k] for k in keys[:3]]
    vault.delete(b"bench", keys)
    r.flushall()
    if mc is not None:
        mc.call("check", size, n)
        mc.call("clear")
    return _row(size, n, rates, READS)


def measure_writes(
    size: int,
    round_bytes: int,
    repeats: int,
    vaults: dict[str, VaultClient],
    rtt: Callable[[], None],
    mc: mooncake.MooncakeClient | None,
) -> dict[str, Any]:
    """Puts of fresh keys every call (what an engine storing new blocks does), counted by what was stored."""
    n = max(1, round_bytes // size)
    payload = [os.urandom(size) for _ in range(n)]
    calls = itertools.count()

    def put(vault: VaultClient) -> Callable[[], object]:
        def call() -> object:
            c = next(calls)
            rtt()
            stored = vault.put(b"bench", {f"p{c}-{i:06d}".encode(): b for i, b in enumerate(payload)})
            if stored != n:
                raise SystemExit(f"a Put stored {stored} of {n} blobs of {size} bytes")
            return stored

        return call

    contenders: dict[str, Callable[[], object]] = {f"tierkv_put_{k}": put(v) for k, v in vaults.items()}
    if mc is not None:
        mc.call("load", size, n)

        def mooncake_put() -> object:
            rtt()
            mc.call("put", size, n)
            return n

        contenders["mooncake_put_batch"] = mooncake_put
    rates = interleaved(contenders, n * size, repeats)
    for v in vaults.values():
        v.flush(b"bench")
    if mc is not None:
        mc.call("clear")
    return _row(size, n, rates, WRITES)


def _row(
    size: int, n: int, rates: dict[str, list[float]], pairs: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    row: dict[str, Any] = {"blob_bytes": size, "round_bytes": n * size, "runs": rates}
    row |= {name: statistics.median(v) for name, v in rates.items()}
    row |= {name: ratios(rates[a], rates[b]) for name, (a, b) in pairs.items() if a in rates and b in rates}
    return row


def synthetic(
    spec: LinkSpec | None, host: str, prefix: tuple[str, ...], args: argparse.Namespace
) -> dict[str, Any]:
    settings = SyntheticSettings(
        shape=parse_shape(args.shape),
        lengths=tuple(int(t[:-1]) * 1024 if t.endswith("k") else int(t) for t in args.tokens.split(",")),
        repeats=args.repeats,
        max_seconds=args.synthetic_seconds,
        overlap="both",
        decode_threads=args.decode_threads,
        link=spec,
    )
    where = VaultSettings(sync="fast", host=host, launch_prefix=prefix)
    result = run_synthetic(config_from_dict({}), settings, where, Console(quiet=True))
    cells = {(c.tokens, c.contender): c for c in result.cells}
    rows = []
    for n in sorted({c.tokens for c in result.cells}):
        raw, behind, after = (cells.get((n, name)) for name in ("raw", "int8+behind", "int8"))
        row: dict[str, Any] = {"tokens": n}
        for name, cell in (("raw", raw), ("int8_behind", behind), ("int8", after)):
            if cell is not None and cell.complete:
                f = cell.figures()
                row[name] = {
                    k: f[k]
                    for k in (
                        "restore_gbps",
                        "restore_wire_gbps",
                        "restore_ms_per_1k_tokens",
                        "restore_tokens_per_s",
                    )
                }
                row[name]["restore_s"] = cell.restore_s
        if raw and behind and len(raw.restore_s) == len(behind.restore_s):
            row["int8_behind_vs_raw"] = ratios(raw.restore_s, behind.restore_s)
        if after and behind and len(after.restore_s) == len(behind.restore_s):
            row["behind_vs_after"] = ratios(after.restore_s, behind.restore_s)
        if raw and after and len(raw.restore_s) == len(after.restore_s):
            row["int8_vs_raw"] = ratios(raw.restore_s, after.restore_s)
        rows.append(row)
    return {"rows": rows, "errors": result.errors, "warnings": result.warnings, "decoder": result.decoder}


def one_link(text: str, args: argparse.Namespace) -> dict[str, Any]:
    """Everything measured over one link; runs in a child process of its own."""
    spec = None if text == "loopback" else parse_link(text)
    with contextlib.ExitStack() as stack:
        if spec is None:
            host, engine_host, prefix, engine = "127.0.0.1", "127.0.0.1", (), contextlib.nullcontext()
        else:
            link = stack.enter_context(link_emulator(spec))
            host, engine_host, prefix, engine = (
                link.vault_host,
                link.engine_host,
                link.vault_prefix,
                link.engine_side(),
            )
        rtt = spec.round_trip if spec is not None else (lambda: None)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tierkv-links-")))
        tcp = stack.enter_context(started([*prefix, *server_command(host)]))
        assert tcp.stdout is not None
        tcp_port = int(tcp.stdout.readline())
        redis_port = REDIS_PORT if spec is not None else free_port(host)  # loopback: beside other runs
        redis_args = [
            "redis-server",
            "--port",
            str(redis_port),
            "--bind",
            host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",  # reachable only inside the namespace (or on loopback)
        ]
        stack.enter_context(started([*prefix, *redis_args, "--dir", str(work)]))
        private = spec is not None  # the link's namespaces: nothing else reaches the vaults there
        vault_proc = VaultProcess(
            work / "vault", host=host, max_bytes="2GiB", sync="fast", prefix=prefix, allow_open=private
        )
        stack.enter_context(vault_proc)
        durable_proc = VaultProcess(
            work / "durable", host=host, max_bytes="2GiB", sync="durable", prefix=prefix, allow_open=private
        )
        stack.enter_context(durable_proc)
        stack.enter_context(engine)
        vault = stack.enter_context(VaultClient(vault_proc.address, timeout=120))
        durable = stack.enter_context(VaultClient(durable_proc.address, timeout=120))
        mc = (
            stack.enter_context(mooncake.mooncake_store(host, engine_host, prefix)) if args.mooncake else None
        )
        r = redis.Redis(host=host, port=redis_port, socket_timeout=120)
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                r.ping()
                break
            time.sleep(0.05)
        pull = tcp_pull(host, tcp_port, rtt)
        reads = [
            measure_reads(int(kib) * 1024, args.round_mib << 20, args.repeats, vault, r, pull, rtt, mc)
            for kib in args.blob_kib.split(",")
        ]
        vaults = {"durable": durable, "fast": vault}
        writes = [
            measure_writes(int(kib) * 1024, args.round_mib << 20, args.repeats, vaults, rtt, mc)
            for kib in args.put_blob_kib.split(",")
            if kib
        ]
        with contextlib.suppress(OSError):
            pull(0)
        restores = synthetic(spec, host, prefix, args) if args.tokens else {}
    return {
        "link": text if spec is None else spec.as_dict(),
        "reads": reads,
        "writes": writes,
        "synthetic": restores,
    }


def _x(r: dict[str, float] | None) -> str:
    return "—" if not r else f"{r['median']:.2f}× ({r['min']:.2f}–{r['max']:.2f})"


def _blob(row: dict[str, Any]) -> str:
    size = int(row["blob_bytes"])
    return f"{size // 1024} KiB" if size < 1 << 20 else f"{size >> 20} MiB"


def _gbps(row: dict[str, Any], name: str) -> str:
    return f"{row[name]:.3f} GB/s" if name in row else "—"


def print_tables(doc: dict[str, Any]) -> None:
    link = doc["link"]
    label = link if isinstance(link, str) else link["label"]
    print(f"\n### {label}\n")
    print(
        "| blob | tierkv BatchGet | Redis MGET | Mooncake batch_get_into | bare TCP "
        "| BatchGet / MGET | BatchGet / Mooncake | BatchGet / TCP |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in doc["reads"]:
        print(
            f"| {_blob(row)} | {_gbps(row, 'tierkv_get_buffers')} | {_gbps(row, 'redis_mget')} "
            f"| {_gbps(row, 'mooncake_get_into')} | {_gbps(row, 'tcp')} | {_x(row.get('get_buffers_vs_mget'))} "
            f"| {_x(row.get('get_buffers_vs_mooncake'))} | {_x(row.get('get_buffers_vs_tcp'))} |"
        )
    if doc.get("writes"):
        print(
            "\n| blob | tierkv Put durable | tierkv Put fast | Mooncake put_batch (RAM) "
            "| durable / Mooncake | fast / Mooncake |"
        )
        print("|---|---|---|---|---|---|")
        for row in doc["writes"]:
            print(
                f"| {_blob(row)} | {_gbps(row, 'tierkv_put_durable')} | {_gbps(row, 'tierkv_put_fast')} "
                f"| {_gbps(row, 'mooncake_put_batch')} | {_x(row.get('durable_vs_mooncake'))} "
                f"| {_x(row.get('fast_vs_mooncake'))} |"
            )
    rows = doc["synthetic"].get("rows", [])
    if not rows:
        return
    print(
        "\n| tokens | raw GB/s (ms / 1k tok) | int8+behind GB/s (ms / 1k tok) | int8 GB/s (decoded after) | int8+behind / raw | behind / after |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:

        def cell(name: str) -> str:
            c = row.get(name)
            return "—" if c is None else f"{c['restore_gbps']:.3f} ({c['restore_ms_per_1k_tokens']:.1f})"

        print(
            f"| {row['tokens']:,} | {cell('raw')} | {cell('int8_behind')} | {cell('int8')} "
            f"| {_x(row.get('int8_behind_vs_raw'))} | {_x(row.get('behind_vs_after'))} |"
        )


def bounded(command: list[str], seconds: float) -> int:
    """Run a child for at most ``seconds``, then SIGTERM it (it tears its link down on the way out)."""
    proc = subprocess.Popen(command)
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        print(f"stopped after --max-seconds {seconds:g}", file=sys.stderr)
        proc.terminate()
        try:
            return proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
    except BaseException:
        proc.terminate()
        proc.wait(60)
        raise


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--links",
        nargs="+",
        default=["1gbe", "5gbe", "10gbe", "25gbe", "loopback"],
        help="links, space-separated: presets, RATE[,RTT] (5gbit,1ms) or loopback",
    )
    parser.add_argument("--round-mib", type=int, default=16, help="bytes per read round")
    parser.add_argument("--blob-kib", default="256,1024", help="blob sizes of the read rounds")
    parser.add_argument(
        "--put-blob-kib", default="256,1024,4096", help="blob sizes of the write rounds ('' to skip)"
    )
    parser.add_argument(
        "--mooncake",
        action=argparse.BooleanOptionalAction,
        default=mooncake.available(),
        help="measure Mooncake Store too (default: where benchmarks/setup-mooncake.sh built .venv-mooncake)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions")
    parser.add_argument("--tokens", default="1k,4k,16k,32k", help="synthetic restore lengths ('' to skip)")
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--decode-threads", type=int, default=1, help="threads per torch int8 decode")
    parser.add_argument("--synthetic-seconds", type=float, default=150.0)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="bound of each link's child")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        assert args.out is not None
        signal.signal(signal.SIGTERM, _interrupt)  # the servers started here stop on the way out
        args.out.write_text(json.dumps(one_link(args.one, args), indent=1))
        return
    if not shutil.which("redis-server"):
        sys.exit("redis-server not found: run benchmarks/setup-redis.sh first")
    if args.mooncake and not mooncake.available():
        sys.exit(f"Mooncake Store not found at {mooncake.PYTHON}: run benchmarks/setup-mooncake.sh first")
    if not args.mooncake:
        print("Mooncake Store not measured (benchmarks/setup-mooncake.sh builds it)", file=sys.stderr)
    docs = []
    for text in args.links:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            child = [
                sys.executable,
                "-m",
                "benchmarks.links",
                *sys.argv[1:],
                "--one",
                text,
                "--out",
                out.name,
            ]
            code = bounded(child, args.max_seconds)
            if code != 0:
                print(f"{text}: no figures (exit {code}; see above)", file=sys.stderr)
                continue
            docs.append(json.loads(Path(out.name).read_text()))
        print_tables(docs[-1])
        sys.stdout.flush()
    print(f"\ntierkv {__version__}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        args.json.write_text(json.dumps({"links": docs, "argv": sys.argv[1:]}, indent=1))


if __name__ == "__main__":
    main()
