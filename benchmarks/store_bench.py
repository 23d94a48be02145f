"""The vault store's Put and BatchGet paths in-process (no network), for comparing two source trees.

    python benchmarks/store_bench.py --compare OLD_TREE NEW_TREE [--rounds 7]

runs one child process per tree and round, in an order rotated from round to round, each importing
``tierkv`` from its tree (``PYTHONPATH``), and prints per tree the median Put and BatchGet throughput
(GB/s of blob bytes) and the new/old ratios. Each child writes ``--blocks`` blobs of ``--blob-kib`` into
a fresh store whose budget holds a quarter of them (so most Puts evict), in batches of ``--batch``,
then reads the last fifth back in batches (``view_many`` and a copy of every view, as a BatchGet
reply does). ``sync_mode = "fast"`` so that the figures are the store's work, not the disk's fsync.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_once(blocks: int, blob_kib: int, batch: int) -> dict[str, float]:
    from tierkv.vault.store import Store

    blob = os.urandom(blob_kib * 1024)
    keys = [b"key-%08d" % i for i in range(blocks)]
    budget = blocks * len(blob) // 4
    with tempfile.TemporaryDirectory() as tmp, Store(tmp, budget, sync_mode="fast") as store:
        start = time.perf_counter()
        for at in range(0, blocks, batch):
            store.put_many(b"ns", [(k, blob, 0) for k in keys[at : at + batch]])
        put_s = time.perf_counter() - start
        tail = keys[-blocks // 5 :]  # a quarter of the charge is blobs plus keys: the last fifth is in
        start = time.perf_counter()
        got = 0
        for at in range(0, len(tail), batch):
            with store.view_many(b"ns", tail[at : at + batch]) as views:
                got += sum(len(bytes(v)) for _, v in views if v is not None)
        get_s = time.perf_counter() - start
        if got != len(tail) * len(blob):
            raise SystemExit(f"read back {got} bytes, expected {len(tail) * len(blob)}")
    return {"put_gbps": blocks * len(blob) / put_s / 1e9, "get_gbps": got / get_s / 1e9}


def compare(trees: list[str], rounds: int, extra: list[str]) -> None:
    results: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(rounds):
        shift = r % len(trees)
        for tree in trees[shift:] + trees[:shift]:
            env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
            out = subprocess.run(
                [sys.executable, __file__, "--run", *extra],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            results[tree].append(json.loads(out.stdout))
    medians = {
        t: {m: statistics.median(r[m] for r in rs) for m in ("put_gbps", "get_gbps")}
        for t, rs in results.items()
    }
    for t, m in medians.items():
        spread = {k: (min(r[k] for r in results[t]), max(r[k] for r in results[t])) for k in m}
        print(
            f"{t}: put {m['put_gbps']:.3f} GB/s ({spread['put_gbps'][0]:.3f}-{spread['put_gbps'][1]:.3f}), "
            f"get {m['get_gbps']:.3f} GB/s ({spread['get_gbps'][0]:.3f}-{spread['get_gbps'][1]:.3f})"
        )
    old, new = medians[trees[0]], medians[trees[-1]]
    print(
        f"ratio new/old: put {new['put_gbps'] / old['put_gbps']:.3f}, get {new['get_gbps'] / old['get_gbps']:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--compare", nargs="+", metavar="TREE", help="source trees to compare, old first")
    parser.add_argument("--run", action="store_true", help="one measurement with the tierkv on PYTHONPATH")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--blocks", type=int, default=4096)
    parser.add_argument("--blob-kib", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    sizes = ["--blocks", str(args.blocks), "--blob-kib", str(args.blob_kib), "--batch", str(args.batch)]
    if args.run:
        print(json.dumps(run_once(args.blocks, args.blob_kib, args.batch)))
    elif args.compare:
        compare(args.compare, args.rounds, sizes)
    else:
        parser.error("give --compare TREE... or --run")


if __name__ == "__main__":
    main()
