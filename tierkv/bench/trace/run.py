"""``tierkv bench trace``: generate (or read) a trace, replay it per capacity and policy, judge, draw."""

from __future__ import annotations

import dataclasses
import logging
import resource
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from tierkv.bench.common import BenchRun, Deadline, progress_bar
from tierkv.bench.record import RunMeta
from tierkv.bench.trace import report
from tierkv.bench.trace.conversations import ConversationSpec, generate_conversations
from tierkv.bench.trace.generate import TraceSpec, generate
from tierkv.bench.trace.model import Trace, summarize, write_trace
from tierkv.bench.trace.prefetch import PrefetchRun, PrefetchSettings, replay_prefetch
from tierkv.bench.trace.reader import ReadOptions, read_trace
from tierkv.bench.trace.reference import Reference, in_process_run, references, work_stream
from tierkv.bench.trace.replay import (
    MIN_VAULT_BYTES,
    PolicyRun,
    ReplaySettings,
    Workload,
    check_capacities,
    prepare,
    replay_one,
    runs_of,
    state_base,
)
from tierkv.bench.trace.simulate import Stream
from tierkv.config import human_bytes

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TraceSettings:
    """Where the trace comes from (a file, else the generator), how it is replayed, where output goes."""

    spec: TraceSpec = dataclasses.field(default_factory=TraceSpec)
    replay: ReplaySettings = dataclasses.field(default_factory=ReplaySettings)
    conversations: ConversationSpec | None = None
    """Generate a hash-id trace of this shape instead of the agent trace."""
    reading: ReadOptions = dataclasses.field(default_factory=ReadOptions)
    """How a trace file is read (its block size given or found, time unit, order, a cap on requests)."""
    blob_bytes_given: bool = False
    """``--blob-bytes`` was given (else a hash-id trace gets the smallest blobs its capacities allow)."""
    in_process: bool = False
    """Replay each policy by its in-process twin instead of a vault."""
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
    references: list[Reference] = dataclasses.field(default_factory=list)

    def figures_document(self) -> dict[str, Any]:
        work = self.workload
        return {
            "references": [r.as_dict() for r in self.references],
            "gap_closed": report.gaps_closed(self.runs, self.references),
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
        for note in self.summary.get("notes", ()):
            console.print(f"trace: {escape(note)}")
        load = self.summary.get("load")
        if load and "peak_rss_bytes" in load:
            console.print(
                f"trace: read in {load['read_s']:.1f} s, prepared in {load['prepare_s']:.1f} s "
                f"({load['us_per_request']:,.0f} µs a request); peak RSS "
                f"{human_bytes(load['peak_rss_after_prepare_bytes'])} then, "
                f"{human_bytes(load['peak_rss_bytes'])} at the end"
            )
        if self.workload is not None:
            report.render_workload(self.workload, self.summary, console)
        if self.references:
            report.render_references(self.references, self.runs, console)
        if self.runs and self.workload is not None:
            report.render_runs(self.runs, self.references, console)
            if any(request.tagged for request in self.workload.requests):
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
    if settings.trace_file:
        trace = read_trace(settings.trace_file, settings.reading)
    elif settings.conversations is not None:
        trace = generate_conversations(settings.conversations)
    else:
        trace = generate(settings.spec)
    if settings.write_trace is not None:
        write_trace(trace, settings.write_trace)
    return trace


def for_trace(settings: TraceSettings, trace: Trace) -> ReplaySettings:
    """The replay settings a trace needs: a hash-id trace is replayed in its own blocks, and without
    ``--blob-bytes`` with the smallest blobs (a multiple of 1 KiB) at which every capacity is a budget a
    vault accepts, so a replay of a production trace moves megabytes, not terabytes."""
    s = settings.replay
    if trace.block_tokens is None:
        return s
    bt = trace.block_tokens
    s = dataclasses.replace(s, block_tokens=bt)
    if settings.blob_bytes_given:
        return s
    blocks = len({(r.tenant, i) for r in trace.requests for i in (r.hash_ids or ())[: r.n_tokens // bt]})
    need = MIN_VAULT_BYTES / (min(s.capacities) * max(1, blocks)) - 64
    return dataclasses.replace(s, blob_bytes=max(1024, -(-int(need) // 1024) * 1024 + 1024))


def peak_rss_bytes() -> int:
    """The process's peak resident set so far (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def load_costs(requests: int, read_s: float, prepare_s: float) -> dict[str, float]:
    """What reading and preparing the trace took: seconds, microseconds per request, the peak RSS."""
    return {
        "read_s": round(read_s, 3),
        "prepare_s": round(prepare_s, 3),
        "us_per_request": round((read_s + prepare_s) / max(1, requests) * 1e6, 1),
        "peak_rss_after_prepare_bytes": peak_rss_bytes(),
    }


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


def _replay_all(
    work: Workload, stream: Stream, settings: TraceSettings, result: TraceResult, console: Console
) -> None:
    """Every (capacity, policy) run, each within its own ``--max-seconds``; a run out of time is named
    and skipped, the others go on."""
    s = settings.replay
    plan = runs_of(s)
    whole = Deadline(float("inf"))
    with state_base(s) as base, progress_bar(console, len(plan) * len(work.requests)) as bar:
        for fraction, policy in plan:
            label = f"{policy} @ {report.pct(fraction)}"
            bar.label(label)
            deadline = Deadline(s.max_seconds)
            if settings.in_process:
                run: PolicyRun | None = in_process_run(work, stream, policy, fraction, s)
                for _ in work.requests:
                    bar.advance()
            else:
                run = replay_one(work, s, policy, fraction, base, bar.advance, deadline)
            if run is None:
                result.truncated = True
                result.warnings.append(f"{label}: {deadline.note()}; run skipped")
                continue
            result.runs.append(run)
            if run.unacked:
                result.errors.append(f"{label}: the vault acknowledged no put of {run.unacked:,} blocks")
    if not result.runs:
        result.errors.append("no run finished within its time limit")
    result.finish(whole)


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
    started = time.perf_counter()
    trace = load_trace(settings)
    read_s = time.perf_counter() - started
    settings = dataclasses.replace(settings, replay=for_trace(settings, trace))
    result.settings = settings
    result.summary = {"source": trace.source, "generator": dict(trace.generator), **summarize(trace.requests)}
    result.summary |= {"reading": dict(trace.reading), "notes": list(trace.notes)}
    started = time.perf_counter()
    work = prepare(trace, settings.replay)
    result.summary["load"] = load_costs(len(trace.requests), read_s, time.perf_counter() - started)
    check_capacities(work, settings.replay)
    result.workload = work
    if not settings.prefetch_only:
        stream = work_stream(work)
        result.references = references(work, stream, settings.replay.capacities)
        _replay_all(work, stream, settings, result, console)
    if settings.prefetch is not None:
        _replay_prefetch(work, settings, settings.prefetch, result, console)
    result.targets = report.targets(result.runs, work, settings.replay.protected_cap)
    if settings.chart is not None and result.runs:
        source = Path(trace.source).name if settings.trace_file else trace.source
        title = f"{source}: {work.distinct:,} blocks of {work.block_tokens} tokens"
        skipped = report.write_chart(result.runs, work, settings.chart, title, result.references)
        if skipped:
            result.warnings.append(skipped)
        else:
            result.chart = str(settings.chart)
    result.verdict = _verdict(result)
    if "load" in result.summary:
        result.summary["load"]["peak_rss_bytes"] = peak_rss_bytes()
    return result


__all__ = ["TraceResult", "TraceSettings", "load_trace", "run_trace"]
