"""What knowing the workload's present would buy on the generated traces (tierkv.bench.trace.informed says
how it is measured): per trace and capacity, the token hit rate of the reference LRU, of ``adaptive``'s
in-process twin, of Belady's rule on the generator's expectations (``informed``), of LRU admitting only
blocks more likely than not used within one LRU lifetime (``informed admission``) and of the offline
optimum with bypass, with the share of the LRU → optimum gap each closes; then the median share over the
traces at each capacity. Run:

    python scripts/retention_informed.py [--seeds 0,1,2] [--shapes chat,docs,agents]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

from retention_figures import hash_traces

from tierkv.bench.trace.bounds import lru_lifetime
from tierkv.bench.trace.conversations import SHAPES, SessionState, generate_conversations
from tierkv.bench.trace.informed import ExpectedBelady, ForecastAdmission, PresentForecast
from tierkv.bench.trace.reference import IN_PROCESS, Reference, references, work_stream
from tierkv.bench.trace.replay import Workload, prepare
from tierkv.bench.trace.run import for_trace
from tierkv.bench.trace.simulate import Cache, LRUCache, Stream, replay

FRACTIONS = (0.02, 0.05, 0.1)
CONTENDERS = ("adaptive", "informed", "informed admission")


def _contenders(
    work: Workload, stream: Stream, states: list[SessionState], ref: Reference
) -> dict[str, Callable[[], Cache]]:
    seconds_per_request = (states[-1].clock_s - states[0].clock_s) / max(1, len(states) - 1)
    horizon_s = lru_lifetime(stream, ref.blocks) * seconds_per_request
    budget = int(work.working_set_bytes * ref.fraction)

    def forecast() -> PresentForecast:
        return PresentForecast(states, stream.block_tokens)

    return {
        "adaptive": lambda: IN_PROCESS["adaptive"](budget, work.charge),
        "informed": lambda: ExpectedBelady(ref.blocks, stream, forecast()),
        "informed admission": lambda: ForecastAdmission(LRUCache(ref.blocks), stream, forecast(), horizon_s),
    }


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
    for name, settings in hash_traces(None, seeds, args.requests).items():
        spec = settings.conversations
        if spec is None or spec.shape not in shapes:
            continue
        states: list[SessionState] = []
        trace = generate_conversations(spec, states.append)
        work = prepare(trace, for_trace(settings, trace))
        stream = work_stream(work)
        for ref in references(work, stream, FRACTIONS):
            cells = [f"{100 * ref.lru:.1f}"]
            for contender, make in _contenders(work, stream, states, ref).items():
                rate = stream.token_rate(replay(stream, make()))
                cells.append(_cell(rate, ref))
                share = ref.closed(rate)
                if share is not None:
                    closed.setdefault((contender, ref.fraction), []).append(share)
            cells.append(f"{100 * ref.optimum_bypass:.1f}")
            rows.append(f"| {name} | {ref.fraction:.0%} | " + " | ".join(cells) + " |")
        print(f"{name}: done", flush=True)
    print("\n| trace | capacity | lru | " + " | ".join(CONTENDERS) + " | optimum |")
    print("|---|---|---|" + "---|" * len(CONTENDERS) + "---|")
    print("\n".join(rows))
    head = " | ".join(f"{f:.0%}" for f in FRACTIONS)
    print(f"\n| median share of the gap closed | {head} |")
    print("|---|" + "---|" * len(FRACTIONS))
    for contender in CONTENDERS:
        cells = []
        for f in FRACTIONS:
            got = closed.get((contender, f), [])
            cells.append(f"{statistics.median(got):+.0%} (min {min(got):+.0%})" if got else "—")
        print(f"| {contender} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
