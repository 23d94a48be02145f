"""data.mdb's size on disk ÷ ``max_bytes`` under eviction churn, through a real vault, then after compaction.

Each scenario starts a vault (durable mode) with an empty directory, Puts ``--overfill`` × the budget in
batches (one client ``put`` per batch, so batch size is what the vault sees per request), deletes a
quarter of a batch now and then when ``deletes`` is set, and samples ``data.mdb`` after every batch.
It prints the ratio at the end and at its peak, then stops the vault and runs ``tierkv vault compact``.
Run:

    python benchmarks/vault_footprint.py [--budget 64MiB] [--overfill 8] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path

from tierkv import VaultClient
from tierkv.config import parse_size
from tierkv.vault.compact import compact
from tierkv.vault.launcher import VaultProcess

KiB, MiB = 1 << 10, 1 << 20
Sizes = Callable[[random.Random], int]


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    sizes: Sizes
    batch: int
    deletes: bool = False


SCENARIOS = [
    Scenario("256 KiB blocks, 1 per put", lambda r: 256 * KiB, 1),
    Scenario("256 KiB blocks, 64 per put", lambda r: 256 * KiB, 64),
    Scenario("4 KiB-1 MiB blocks, 32 per put", lambda r: r.randrange(4 * KiB, MiB), 32),
    Scenario("4 KiB-1 MiB blocks, 32 per put, deletes", lambda r: r.randrange(4 * KiB, MiB), 32, True),
    Scenario("1-8 KiB entries, 256 per put", lambda r: r.randrange(KiB, 8 * KiB), 256),
]


def run(scenario: Scenario, budget: int, overfill: int, workdir: Path) -> dict[str, object]:
    rng = random.Random(1)
    payload = os.urandom(2 * MiB)
    path = workdir / scenario.name.replace(" ", "_")
    vault = VaultProcess(path, max_bytes=budget, sync="durable").start()
    written = peak = 0
    try:
        with VaultClient(vault.address, timeout=60) as c:
            while written < overfill * budget:
                batch = {}
                for _ in range(scenario.batch):
                    n = scenario.sizes(rng)
                    start = rng.randrange(len(payload) - n)
                    batch[f"k{written}".encode()] = payload[start : start + n]
                    written += n
                c.put(b"ns", batch)
                if scenario.deletes and rng.random() < 0.2:
                    c.delete(b"ns", rng.sample(list(batch), len(batch) // 4))
                peak = max(peak, (path / "data.mdb").stat().st_size)
            used = c.stats().used_bytes
    finally:
        vault.stop()
    end = (path / "data.mdb").stat().st_size
    compacted = compact(path).after
    return {
        "scenario": scenario.name,
        "end": round(end / budget, 2),
        "peak": round(peak / budget, 2),
        "used": round(used / budget, 2),
        "compacted": round(compacted / budget, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="64MiB", help="max_bytes of the vault")
    parser.add_argument("--overfill", type=int, default=8, help="bytes written as a multiple of the budget")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    budget = parse_size(args.budget)
    with tempfile.TemporaryDirectory(prefix="tierkv-footprint-") as tmp:
        rows = [run(s, budget, args.overfill, Path(tmp)) for s in SCENARIOS]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"data.mdb ÷ max_bytes ({args.budget}, {args.overfill}× overfill, durable)")
    print(f"{'scenario':44s} {'end':>6s} {'peak':>6s} {'used':>6s} {'compacted':>10s}")
    for row in rows:
        print(
            f"{row['scenario']:44s} {row['end']:6.2f} {row['peak']:6.2f} {row['used']:6.2f} {row['compacted']:10.2f}"
        )


if __name__ == "__main__":
    main()
