"""What knowing the workload's present would buy on the generated traces (tierkv.bench.trace.informed says
how it is measured): per trace and capacity, the token hit rate of the reference LRU, of ``adaptive``'s
in-process twin, of Belady's rule on the generator's expectations (``informed``), of LRU admitting only
blocks more likely than not used within one LRU lifetime (``informed admission``), of LRU told which
blocks no one will use again (``lru + end hint``) and of the offline optimum with bypass, with the share
of the LRU → optimum gap each closes; then the median share over the traces at each capacity, with the
informed bound also measured without each piece of its knowledge (sessions' ends, their paces, new
sessions' arrivals). Run:

    python scripts/retention_informed.py [--seeds 0,1,2] [--shapes chat,docs,agents]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
from collections.abc import Callable

from retention_figures import hash_traces

from tierkv.bench.trace.bounds import lru_lifetime
from tierkv.bench.trace.conversations import SHAPES, SessionState, generate_conversations
from tierkv.bench.trace.informed import (
    ExpectedBelady,
    ForecastAdmission,
    HintedLRU,
    Knowledge,
    PresentForecast,
)
from tierkv.bench.trace.reference import IN_PROCESS, Reference, references, work_stream
from tierkv.bench.trace.replay import Workload, prepare
from tierkv.bench.trace.run import for_trace
from tierkv.bench.trace.simulate import Cache, LRUCache, Stream, replay

FRACTIONS = (0.02, 0.05, 0.1)
CONTENDERS = ("adaptive", "informed", "informed admission", "lru + end hint")
"""The contenders of the first per-trace table."""
ABLATIONS = {
    "informed without ends": {"ends": False},
    "informed without paces": {"paces": False},
    "informed without arrivals": {"arrivals": False},
}
"""The informed bound without each piece of its knowledge (the second table)."""
IN_USE_HINT = "lru + end hint, prefixes while in use"
"""LRU told the ends, and that a shared prefix no live session uses is worth no more than a dead block."""


def _contenders(
    work: Workload, stream: Stream, states: list[SessionState], ref: Reference
) -> dict[str, Callable[[], Cache]]:
    seconds_per_request = (states[-1].clock_s - states[0].clock_s) / max(1, len(states) - 1)
    horizon_s = lru_lifetime(stream, ref.blocks) * seconds_per_request
    budget = int(work.working_set_bytes * ref.fraction)
    paces = {s.session: s.think_s for s in states}
    common = Knowledge(common_think_s=statistics.fmean(paces.values()))

    def forecast(**without: bool) -> PresentForecast:
        return PresentForecast(states, stream.block_tokens, dataclasses.replace(common, **without))

    out: dict[str, Callable[[], Cache]] = {
        "adaptive": lambda: IN_PROCESS["adaptive"](budget, work.charge),
        "informed": lambda: ExpectedBelady(ref.blocks, stream, forecast()),
        "informed admission": lambda: ForecastAdmission(LRUCache(ref.blocks), stream, forecast(), horizon_s),
        "lru + end hint": lambda: HintedLRU(ref.blocks, stream, forecast()),
    }

    def informed(**without: bool) -> Callable[[], Cache]:
        return lambda: ExpectedBelady(ref.blocks, stream, forecast(**without))

    out |= {name: informed(**without) for name, without in ABLATIONS.items()}
    out[IN_USE_HINT] = lambda: HintedLRU(ref.blocks, stream, forecast(arrivals=False))
    return out


def _cell(rate: float, ref: Reference) -> str:
    closed = ref.closed(rate)
    return f"{100 * rate:.1f} ({'—' if closed is None else f'{closed:+.0%}'})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--requests", type=int, default=4000, help="requests per generated hash-id trace")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    shapes = [s for s in args.shapes.split(",") if s]
    closed: dict[tuple[str, float], list[float]] = {}
    rows: list[str] = []
    ablated: list[str] = []
    for name, settings in hash_traces(None, seeds, args.requests).items():
        spec = settings.conversations
        if spec is None or spec.shape not in shapes:
            continue
        states: list[SessionState] = []
        trace = generate_conversations(spec, states.append)
        work = prepare(trace, for_trace(settings, trace))
        stream = work_stream(work)
        contenders = functools.partial(_contenders, work, stream, states)
        for ref in references(work, stream, FRACTIONS):
            rates = {c: stream.token_rate(replay(stream, make())) for c, make in contenders(ref).items()}
            for contender, rate in rates.items():
                share = ref.closed(rate)
                if share is not None:
                    closed.setdefault((contender, ref.fraction), []).append(share)
            for table, names in ((rows, CONTENDERS), (ablated, (*ABLATIONS, IN_USE_HINT))):
                cells = [f"{100 * ref.lru:.1f}", *(_cell(rates[c], ref) for c in names)]
                cells.append(f"{100 * ref.optimum_bypass:.1f}")
                table.append(f"| {name} | {ref.fraction:.0%} | " + " | ".join(cells) + " |")
        print(f"{name}: done", flush=True)
    for table, names in ((rows, CONTENDERS), (ablated, (*ABLATIONS, IN_USE_HINT))):
        print("\n| trace | capacity | lru | " + " | ".join(names) + " | optimum |")
        print("|---|---|---|" + "---|" * len(names) + "---|")
        print("\n".join(table))
    head = " | ".join(f"{f:.0%}" for f in FRACTIONS)
    print(f"\n| median share of the gap closed | {head} |")
    print("|---|" + "---|" * len(FRACTIONS))
    for contender in (*CONTENDERS, *ABLATIONS, IN_USE_HINT):
        cells = []
        for f in FRACTIONS:
            got = closed.get((contender, f), [])
            cells.append(f"{statistics.median(got):+.0%} (min {min(got):+.0%})" if got else "—")
        print(f"| {contender} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
