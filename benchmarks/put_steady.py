"""Steady-state Put rate of two vault builds, interleaved: Puts a fraction of a second apart, as engines
send them, so that a heap trim on a timer (which makes the next Put fault its buffers in again) shows.

Each contender is a real vault process running the ``tierkv`` found under its source tree (``--old`` and
``--new``, default: /work/main-like trees given on the command line); both store on ``--dir`` (a RAM disk
by default) in ``fast`` mode with the same budget. A sitting is ``--puts`` Puts of ``--put-mib`` MiB of
``--blob-kib`` KiB blobs over the bulk port, ``--gap`` seconds apart; sittings alternate between the
contenders (the order rotated each repetition). Reported: median and quartiles of GB/s per Put, the
ratio of medians, and the vault's minor page faults per Put.

    python benchmarks/put_steady.py --old /path/to/old/tree --new . [--blob-kib 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from tierkv import VaultClient
from tierkv.vault.launcher import VaultProcess

MiB = 1 << 20


def minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[7])


def sitting(
    vault: VaultProcess, blobs: list[bytes], puts: int, gap: float, tag: int
) -> tuple[list[float], float]:
    """GB/s of each Put and the vault's minor faults per Put."""
    assert vault.proc is not None
    nbytes = sum(len(b) for b in blobs)
    rates = []
    faults = minor_faults(vault.proc.pid)
    with VaultClient(vault.address, timeout=120) as c:
        for p in range(puts):
            items = {b"%d-%d-%d" % (tag, p, i): b for i, b in enumerate(blobs)}
            start = time.perf_counter()
            stored = c.put(b"steady", items)
            rates.append(nbytes / (time.perf_counter() - start) / 1e9)
            assert stored == len(items), f"{stored} of {len(items)} stored"
            time.sleep(gap)
    return rates, (minor_faults(vault.proc.pid) - faults) / puts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="source tree of the baseline build")
    ap.add_argument("--new", required=True, help="source tree of the build under test")
    ap.add_argument("--dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None)
    ap.add_argument("--budget", default="1GiB")
    ap.add_argument("--blob-kib", type=int, default=1024)
    ap.add_argument("--put-mib", type=int, default=64)
    ap.add_argument("--puts", type=int, default=24)
    ap.add_argument("--gap", type=float, default=0.3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    blob = os.urandom(args.blob_kib * 1024)
    blobs = [blob] * (args.put_mib * 1024 // args.blob_kib)
    rates: dict[str, list[float]] = {"old": [], "new": []}
    faults: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="tierkv-steady-", dir=args.dir) as tmp:
        vaults = {
            name: VaultProcess(
                Path(tmp) / name,
                max_bytes=args.budget,
                sync="fast",
                env={"PYTHONPATH": str(Path(tree).resolve())},
            ).start()
            for name, tree in (("old", args.old), ("new", args.new))
        }
        try:
            names = list(vaults)
            for rep in range(args.repeats):
                for name in names[rep % 2 :] + names[: rep % 2]:
                    r, f = sitting(vaults[name], blobs, args.puts, args.gap, rep)
                    rates[name] += r
                    faults[name].append(f)
        finally:
            for v in vaults.values():
                v.stop()
    summary = {
        name: {
            "median_gbps": statistics.median(r),
            "quartiles_gbps": statistics.quantiles(r, n=4),
            "minor_faults_per_put": statistics.median(faults[name]),
        }
        for name, r in rates.items()
    }
    ratio = summary["new"]["median_gbps"] / summary["old"]["median_gbps"]  # type: ignore[operator]
    if args.json:
        print(json.dumps({"args": vars(args), "summary": summary, "new_over_old": ratio}, indent=1))
    else:
        print(
            f"{args.put_mib} MiB Puts of {args.blob_kib} KiB blobs, {args.gap} s apart, {args.repeats} sittings each"
        )
        for name, s in summary.items():
            q = s["quartiles_gbps"]
            print(
                f"  {name}: median {s['median_gbps']:.2f} GB/s (q1 {q[0]:.2f}, q3 {q[2]:.2f}),"  # type: ignore[index]
                f" {s['minor_faults_per_put']:.0f} minor faults per Put"
            )
        print(f"  new / old: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
