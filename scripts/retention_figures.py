"""The figures and charts of docs/performance/retention.md: every trace at every capacity, the reference
LRU, ``adaptive`` and the offline optimum, and the share of the LRU → optimum gap closed.

Traces: Mooncake's FAST'25 conversation and synthetic traces when ``--mooncake DIR`` holds them (from
https://github.com/kvcache-ai/Mooncake, ``FAST25-release/traces/``; they are not shipped with tierkv), the
generated chat, docs and agents shapes with several seeds, and the tagged agent trace of ``bench trace``.
Hash-id traces are replayed by the policies' in-process twins (a test holds them equal to the vault, hit
for hit); the agent trace goes through real vaults, so its tags count. Run:

    python scripts/retention_figures.py [--mooncake DIR] [--out docs/performance] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from tierkv.bench.trace.conversations import SHAPES, ConversationSpec
from tierkv.bench.trace.generate import TraceSpec
from tierkv.bench.trace.replay import ReplaySettings
from tierkv.bench.trace.report import pct
from tierkv.bench.trace.run import TraceResult, TraceSettings, run_trace

CAPACITIES = (0.01, 0.02, 0.05, 0.1, 0.2)
MOONCAKE = ("conversation_trace", "synthetic_trace")


def _run(name: str, settings: TraceSettings, out: Path) -> TraceResult:
    chart = out / "retention" / f"{name}.png"
    result = run_trace(dataclasses.replace(settings, chart=chart), Console(file=io.StringIO()))
    if result.errors:
        raise SystemExit(f"{name}: {result.errors}")
    return result


def _rows(name: str, result: TraceResult) -> list[dict[str, Any]]:
    refs = {r.fraction: r for r in result.references}
    rows = []
    for run in result.runs:
        ref = refs[run.fraction]
        rows.append(
            {
                "trace": name,
                "policy": run.policy,
                "capacity": pct(run.fraction),
                "token_hit_rate": run.token_hit_rate,
                "lru": ref.lru,
                "optimum": ref.optimum_bypass,
                "optimum_no_bypass": ref.optimum,
                "gap_closed": ref.closed(run.token_hit_rate),
            }
        )
    return rows


def hash_traces(mooncake: Path | None, seeds: list[int], requests: int) -> dict[str, TraceSettings]:
    replay = ReplaySettings(policies=("lru", "adaptive"), capacities=CAPACITIES)
    found: dict[str, TraceSettings] = {}
    for name in MOONCAKE if mooncake else ():
        path = mooncake / f"{name}.jsonl" if mooncake else None
        found[f"mooncake-{name.split('_')[0]}"] = TraceSettings(
            replay=replay, trace_file=path, in_process=True
        )
    for shape in SHAPES:
        for seed in seeds:
            spec = ConversationSpec(shape=shape, seed=seed, requests=requests)
            found[f"{shape}-seed{seed}"] = TraceSettings(replay=replay, conversations=spec, in_process=True)
    return found


def agent_trace() -> TraceSettings:
    """The tagged agent trace through real vaults (small blobs so that 2 % is still a vault's budget)."""
    spec = TraceSpec(seed=0, tenants=3, agents=3, sessions=12, turns=8)
    replay = ReplaySettings(
        policies=("lru", "adaptive", "context"), capacities=(0.02, 0.05, 0.1, 0.3, 0.6), blob_bytes=4096
    )
    return TraceSettings(spec=spec, replay=replay)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mooncake", type=Path, help="directory with Mooncake's FAST'25 traces")
    ap.add_argument("--out", type=Path, default=Path("docs/performance"))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--requests", type=int, default=4000, help="requests per generated hash-id trace")
    ap.add_argument("--no-agent", action="store_true", help="skip the agent trace (it starts vaults)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    traces = hash_traces(args.mooncake, seeds, args.requests)
    if not args.no_agent:
        traces["agent-trace"] = agent_trace()
    rows: list[dict[str, Any]] = []
    targets: dict[str, list[str]] = {}
    for name, settings in traces.items():
        result = _run(name, settings, args.out)
        rows += _rows(name, result)
        targets[name] = [t.line() for t in result.targets if t.status != "n/a"]
        print(f"{name}: done", flush=True)
    doc = {"capacities": [pct(c) for c in CAPACITIES], "rows": rows, "targets": targets}
    target = args.out / "retention" / "figures.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(doc, indent=1) + "\n")
    for row in rows:
        if row["policy"] == "adaptive":
            closed = row["gap_closed"]
            print(
                f"{row['trace']:28} {row['capacity']:>4} lru {row['lru']:.3f} adaptive "
                f"{row['token_hit_rate']:.3f} optimum {row['optimum']:.3f} closed "
                f"{'—' if closed is None else f'{closed:+.1%}'}"
            )


if __name__ == "__main__":
    main()
