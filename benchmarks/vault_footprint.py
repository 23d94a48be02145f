"""data.mdb's size on disk ÷ ``max_bytes`` under eviction churn, through a real vault, then after compaction.

Each scenario starts a vault (durable mode) with an empty directory, Puts ``--overfill`` × the budget in
batches (one client ``put`` per batch, so batch size is what the vault sees per request), deletes a
quarter of a batch now and then when ``deletes`` is set, and samples ``data.mdb`` after every batch.
It prints the ratio at the end and at its peak, then stops the vault and runs ``tierkv vault compact``.
``--readers N`` adds N threads that BatchGet recently written keys all the while (a read transaction
keeps the pages it sees from reuse), ``--kill-every K`` kills the vault with SIGKILL and restarts it after
every K Puts, ``--policy`` picks the eviction policy, ``--only`` runs the scenarios whose name contains it.
Run:

    python benchmarks/vault_footprint.py [--budget 64MiB] [--overfill 8] [--readers 4] [--kill-every 50] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from tierkv import VaultClient
from tierkv.config import parse_size
from tierkv.errors import VaultError
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


@dataclasses.dataclass(frozen=True)
class Load:
    readers: int = 0
    kill_every: int = 0
    policy: str = "lru"


def read_recent(address: str, recent: list[bytes], stop: threading.Event) -> int:
    """BatchGet the 16 most recently written keys until ``stop``; the number of calls that answered."""
    calls = 0
    with VaultClient(address, timeout=10) as c:
        while not stop.is_set() and calls < 1_000_000:
            with contextlib.suppress(VaultError):
                c.get(b"ns", recent[-16:])
                calls += 1
    return calls


def run(scenario: Scenario, budget: int, overfill: int, workdir: Path, load: Load) -> dict[str, object]:
    rng = random.Random(1)
    payload = os.urandom(2 * MiB)
    path = workdir / scenario.name.replace(" ", "_")
    extra = ["--policy", load.policy]
    vault = VaultProcess(path, max_bytes=budget, sync="durable", extra_args=extra).start()
    written = peak = puts = 0
    recent: list[bytes] = [b"none"]
    stop = threading.Event()
    readers = [
        threading.Thread(target=read_recent, args=(vault.address, recent, stop)) for _ in range(load.readers)
    ]
    for t in readers:
        t.start()
    try:
        c = VaultClient(vault.address, timeout=60)
        while written < overfill * budget:
            batch = {}
            for _ in range(scenario.batch):
                n = scenario.sizes(rng)
                start = rng.randrange(len(payload) - n)
                batch[f"k{written}".encode()] = payload[start : start + n]
                written += n
            with contextlib.suppress(VaultError):  # a Put cut by a kill is simply lost
                c.put(b"ns", batch)
            recent.extend(batch)
            del recent[:-64]
            puts += 1
            if scenario.deletes and rng.random() < 0.2:
                c.delete(b"ns", rng.sample(list(batch), len(batch) // 4))
            peak = max(peak, (path / "data.mdb").stat().st_size)
            if load.kill_every and puts % load.kill_every == 0:
                vault.kill()
                vault = VaultProcess(
                    path, port=vault.port, max_bytes=budget, sync="durable", extra_args=extra
                )
                vault.start()  # the same port: the readers reconnect
                c.close()
                c = VaultClient(vault.address, timeout=60)
        try:
            used = c.stats().used_bytes
        except VaultError as exc:
            raise SystemExit(f"vault gone: {exc}\n{vault.log_tail()}") from None
        c.close()
    finally:
        stop.set()
        for t in readers:
            t.join()
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
    parser.add_argument("--readers", type=int, default=0, help="threads reading recent keys meanwhile")
    parser.add_argument("--kill-every", type=int, default=0, help="SIGKILL and restart after every K Puts")
    parser.add_argument("--policy", default="lru")
    parser.add_argument("--only", default="", help="run the scenarios whose name contains this")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = Load(args.readers, args.kill_every, args.policy)
    budget = parse_size(args.budget)
    with tempfile.TemporaryDirectory(prefix="tierkv-footprint-") as tmp:
        rows = [run(s, budget, args.overfill, Path(tmp), load) for s in SCENARIOS if args.only in s.name]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"data.mdb ÷ max_bytes ({args.budget}, {args.overfill}× overfill, durable, {load.policy},"
        f" {load.readers} readers, kill -9 every {load.kill_every or 'never'} Puts)"
    )
    print(f"{'scenario':44s} {'end':>6s} {'peak':>6s} {'used':>6s} {'compacted':>10s}")
    for row in rows:
        print(
            f"{row['scenario']:44s} {row['end']:6.2f} {row['peak']:6.2f} {row['used']:6.2f} {row['compacted']:10.2f}"
        )


if __name__ == "__main__":
    main()
