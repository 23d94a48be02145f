"""What admission alone could reach on every trace of docs/performance/retention.md, and how well what a
vault sees when a block arrives predicts it (tierkv.bench.trace.bounds says how each is measured).

Prints three Markdown tables: the median (and lowest) share of the LRU → optimum gap closed by LRU and by
``adaptive`` when an oracle admits only blocks looked up again (ever, or within 1, 2 or 4 LRU lifetimes),
at 2, 5 and 10 %; and, at 5 %, the rate of "looked up again within one LRU lifetime" per class of block,
by what a block is when it arrives and, for new blocks, by how their conversation went on (turn count,
time since the chain's previous extension). Run:

    python scripts/retention_bounds.py [--mooncake DIR] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

from retention_figures import hash_traces

from tierkv.bench.trace.bounds import (
    CLASSES,
    CONTINUATION_CLASSES,
    FAN_OUTS,
    TURNS,
    ArrivalRates,
    OracleAdmission,
    arrival_rates,
    continuation_rates,
    lru_lifetime,
)
from tierkv.bench.trace.reference import references, work_stream
from tierkv.bench.trace.replay import prepare
from tierkv.bench.trace.run import for_trace, load_trace
from tierkv.bench.trace.simulate import AdaptiveCache, Cache, LRUCache, Stream, replay

FRACTIONS = (0.02, 0.05, 0.1)
HORIZONS: tuple[int | None, ...] = (None, 1, 2, 4)
"""Oracle horizons in LRU lifetimes (None: looked up again ever)."""
CACHES: dict[str, Callable[[int], Cache]] = {"lru": LRUCache, "adaptive": AdaptiveCache}
FAN_OUT_NAMES = tuple(name for name, _ in FAN_OUTS)


def _horizon_name(h: int | None) -> str:
    return "ever" if h is None else f"within {h} LRU lifetime{'s' if h > 1 else ''}"


def _closed(stream: Stream, cache: Cache, lru: float, optimum: float) -> float | None:
    rate = stream.token_rate(replay(stream, cache))
    return None if optimum - lru < 0.001 else (rate - lru) / (optimum - lru)


def _rate_cells(found: ArrivalRates, classes: tuple[str, ...], *groups: tuple[str, ...]) -> str:
    """Table cells: each class's rate, with, for the classes of each of ``groups`` (classes that part the
    same blocks), its share of that group's blocks."""
    share: dict[str, float] = {}
    for group in groups:
        total = sum(found.counts[c] for c in group) or 1
        share.update((c, found.counts[c] / total) for c in group)
    cells = []
    for c in classes:
        rate = found.rate(c)
        cell = "—" if rate is None else f"{rate:.2f}"
        cells.append(f"{cell} ({share[c]:.0%})" if c in share and rate is not None else cell)
    return " | ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mooncake", type=Path, help="directory with Mooncake's FAST'25 traces")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--requests", type=int, default=4000, help="requests per generated hash-id trace")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    closed: dict[tuple[str, int | None, float], list[float]] = {}
    rates: list[tuple[str, int, str, str]] = []
    for name, settings in hash_traces(args.mooncake, seeds, args.requests).items():
        trace = load_trace(settings)
        work = prepare(trace, for_trace(settings, trace))
        stream = work_stream(work)
        times = [r.timestamp for r in work.requests]
        for ref in references(work, stream, FRACTIONS):
            life = lru_lifetime(stream, ref.blocks)
            if ref.fraction == 0.05:
                arrival = _rate_cells(arrival_rates(stream, life), CLASSES)
                continued = continuation_rates(stream, life, times)
                going_on = _rate_cells(continued, CONTINUATION_CLASSES, TURNS, FAN_OUT_NAMES)
                rates.append((name, life, arrival, going_on))
            for h in HORIZONS:
                horizon = None if h is None else h * life
                for cache_name, make in CACHES.items():
                    oracle = OracleAdmission(make(ref.blocks), stream, horizon)
                    share = _closed(stream, oracle, ref.lru, ref.optimum_bypass)
                    if share is not None:
                        closed.setdefault((cache_name, h, ref.fraction), []).append(share)
        print(f"{name}: done", flush=True)
    head = " | ".join(f"{f:.0%}" for f in FRACTIONS)
    print(f"\n| oracle admits blocks looked up again | evicting as | {head} |")
    print("|---|---|" + "---|" * len(FRACTIONS))
    for h in HORIZONS:
        for cache_name in CACHES:
            cells = []
            for f in FRACTIONS:
                got = closed.get((cache_name, h, f), [])
                cells.append(f"{statistics.median(got):.0%} (min {min(got):+.0%})" if got else "—")
            print(f"| {_horizon_name(h)} | {cache_name} | " + " | ".join(cells) + " |")
    print("\n| trace | LRU lifetime (requests) | " + " | ".join(CLASSES) + " |")
    print("|---|---|" + "---|" * len(CLASSES))
    for name, life, arrival, _ in rates:
        print(f"| {name} | {life} | {arrival} |")
    print("\n| trace | " + " | ".join(CONTINUATION_CLASSES) + " |")
    print("|---|" + "---|" * len(CONTINUATION_CLASSES))
    for name, _, _, going_on in rates:
        print(f"| {name} | {going_on} |")


if __name__ == "__main__":
    main()
