"""``tierkv bench trace``: generate (or read) a trace, replay it per capacity and policy, judge, draw."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from tierkv.bench.common import BenchRun, Deadline, progress_bar
from tierkv.bench.record import RunMeta
from tierkv.bench.trace import report
from tierkv.bench.trace.generate import TraceSpec, generate
from tierkv.bench.trace.model import Trace, read_trace, summarize, write_trace
from tierkv.bench.trace.prefetch import PrefetchRun, PrefetchSettings, replay_prefetch
from tierkv.bench.trace.replay import (
    PolicyRun,
    ReplaySettings,
    Workload,
    check_capacities,
    prepare,
    replay_one,
    runs_of,
    state_base,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TraceSettings:
    """Where the trace comes from (a file, else the generator), how it is replayed, where output goes."""

    spec: TraceSpec = dataclasses.field(default_factory=TraceSpec)
    replay: ReplaySettings = dataclasses.field(default_factory=ReplaySettings)
    trace_file: Path | None = None
    write_trace: Path | None = None
    chart: Path | None = None
    prefetch: PrefetchSettings | None = None
    """Also replay with and without predictive prefetch (``--prefetch SIZE``)."""
    prefetch_only: bool = False


@dataclasses.dataclass
class TraceResult(BenchRun):
    settings: TraceSettings = dataclasses.field(default_factory=TraceSettings)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    workload: Workload | None = None
    runs: list[PolicyRun] = dataclasses.field(default_factory=list)
    targets: list[report.Target] = dataclasses.field(default_factory=list)
    chart: str | None = None
    prefetch: PrefetchRun | None = None

    def figures_document(self) -> dict[str, Any]:
        work = self.workload
        return {
            "trace": self.summary,
            "working_set": None
            if work is None
            else {
                "blocks": work.distinct,
                "bytes": work.working_set_bytes,
                "protected_bytes": work.protected_bytes,
                "block_tokens": work.block_tokens,
                "entry_bytes": work.charge,
                "ceiling": {k: t.as_dict() for k, t in sorted(work.ceiling().items())},
            },
            "runs": [r.as_dict() for r in self.runs],
            "targets": [dataclasses.asdict(t) for t in self.targets],
            "chart": self.chart,
            "prefetch": None if self.prefetch is None else self.prefetch.as_dict(),
        }

    def render(self, console: Console) -> None:
        s = self.settings.replay
        console.print(
            f"[bold]tierkv bench trace[/bold] — {self.summary.get('source', '')}; blocks of {s.block_tokens} "
            f"tokens, blobs of {s.blob_bytes:,} bytes ({s.model}), prefill at {s.prefill_tps:,.0f} tok/s"
        )
        if self.workload is not None:
            report.render_workload(self.workload, self.summary, console)
        if self.runs and self.workload is not None:
            report.render_runs(self.runs, console)
            report.render_classes(self.runs, self.workload.ceiling(), console)
        report.render_targets(self.targets, console)
        if self.prefetch is not None:
            report.render_prefetch(self.prefetch.as_dict(), console)
        if self.chart:
            console.print(f"chart: {self.chart}")
        for w in self.warnings:
            console.print(f"[yellow]warning:[/yellow] {escape(w)}")
        for e in self.errors:
            console.print(f"[red]error:[/red] {escape(e)}")
        console.print(self.verdict)


def load_trace(settings: TraceSettings) -> Trace:
    trace = read_trace(settings.trace_file) if settings.trace_file else generate(settings.spec)
    if settings.write_trace is not None:
        write_trace(trace, settings.write_trace)
    return trace


def _verdict(result: TraceResult) -> str:
    if result.settings.prefetch_only and result.prefetch is not None:
        doc = result.prefetch.as_dict()
        share, saved = doc["block_share_from_prefetch"] or 0.0, doc["median_saved_ms"]
        return f"prefetch: {share:.1%} of restored blocks from the buffer; median restore saving {saved} ms"
    if not result.runs:
        return result.failure("nothing replayed")
    met = sum(t.status == report.MET for t in result.targets)
    short = sum(t.status == report.SHORT for t in result.targets)
    if not result.targets:
        missing = "no lru run to judge against" if all(r.policy != "lru" for r in result.runs) else "only lru"
        return f"replayed {len(result.runs)} runs; targets not judged ({missing})"
    return (
        f"design targets of the policies against lru at equal capacity: {met} met, {short} short "
        f"(of {len(result.targets)}; a comparison of policies on this trace, not a failed run)"
    )


def _replay_all(work: Workload, settings: TraceSettings, result: TraceResult, console: Console) -> None:
    s = settings.replay
    deadline = Deadline(s.max_seconds)
    plan = runs_of(s)
    with state_base(s) as base, progress_bar(console, len(plan) * len(work.requests)) as bar:
        for fraction, policy in plan:
            bar.label(f"{policy} @ {fraction:.0%}")
            run = replay_one(work, s, policy, fraction, base, bar.advance, deadline)
            if run is None:
                result.truncated = True
                done = {(r.policy, r.fraction) for r in result.runs}
                skipped = [f"{p}@{c:.0%}" for c, p in plan if (p, c) not in done]
                result.warnings.append(f"{deadline.note()}: skipped {', '.join(skipped)}")
                break
            result.runs.append(run)
            if run.unacked:
                result.errors.append(
                    f"{policy} @ {fraction:.0%}: the vault acknowledged no put of {run.unacked:,} blocks"
                )
    if not result.runs:
        result.errors.append(f"{deadline.note()} before the first replay finished")
    result.finish(deadline)


def _replay_prefetch(
    work: Workload, settings: TraceSettings, prefetch: PrefetchSettings, result: TraceResult, console: Console
) -> None:
    deadline = Deadline(settings.replay.max_seconds)
    with state_base(settings.replay) as base, progress_bar(console, len(work.requests)) as bar:
        bar.label("prefetch on/off")
        (base / "on").mkdir(exist_ok=True)
        (base / "off").mkdir(exist_ok=True)
        result.prefetch = replay_prefetch(work, settings.replay, prefetch, base, bar.advance, deadline)
    if result.prefetch is None:
        result.truncated = True
        result.warnings.append(f"{deadline.note()}: the prefetch comparison did not finish")


def run_trace(settings: TraceSettings, console: Console) -> TraceResult:
    """The whole bench; setting errors raise :class:`BenchError` before any vault starts."""
    meta = RunMeta("trace", {"replay": dataclasses.asdict(settings.replay)})
    result = TraceResult(meta, settings=settings)
    trace = load_trace(settings)
    result.summary = {"source": trace.source, "generator": dict(trace.generator), **summarize(trace.requests)}
    work = prepare(trace, settings.replay)
    check_capacities(work, settings.replay)
    result.workload = work
    if not settings.prefetch_only:
        _replay_all(work, settings, result, console)
    if settings.prefetch is not None:
        _replay_prefetch(work, settings, settings.prefetch, result, console)
    result.targets = report.targets(result.runs, work, settings.replay.protected_cap)
    if settings.chart is not None and result.runs:
        title = f"tierkv bench trace: {trace.source}, {work.distinct:,} blocks of {work.block_tokens} tokens"
        skipped = report.write_chart(result.runs, work, settings.chart, title)
        if skipped:
            result.warnings.append(skipped)
        else:
            result.chart = str(settings.chart)
    result.verdict = _verdict(result)
    return result


__all__ = ["TraceResult", "TraceSettings", "load_trace", "run_trace"]
