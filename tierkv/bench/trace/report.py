"""Issue 11's targets, the tables and the chart of a trace replay.

Targets, each at equal capacity against ``lru`` (checked for every other policy replayed, the issue's
being ``context``):

- **protected**: blocks of protected classes hit every time an unbounded vault would have hit them,
  while the protected working set fits the cap (``--protected-cap`` × capacity); past the cap the target
  does not apply and says so;
- **important**: at least 1.5× ``lru``'s block hit rate on blocks of importance ≥ 0.7; where 1.5× ``lru``'s
  is above what an unbounded vault hits (``lru`` already keeps nearly all of them) no policy can reach it
  and the target does not apply;
- **overall**: a token hit rate no more than 5 % (relative) below ``lru``'s.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from tierkv.bench.trace.reference import Reference
from tierkv.bench.trace.replay import ALL, IMPORTANT_GROUP, PROTECTED, PolicyRun, Tally, Workload
from tierkv.config import human_bytes

log = logging.getLogger(__name__)

IMPORTANT_FACTOR: Final = 1.5
OVERALL_SLACK: Final = 0.05
MET: Final = "met"
SHORT: Final = "short"


@dataclasses.dataclass(frozen=True)
class Target:
    """One design target at one capacity for one policy: met, short (of the target) or n/a, with the numbers
    behind it. A policy falling short of a target is a finding about the policy on this trace, not a
    failure of the run."""

    name: str
    policy: str
    fraction: float
    status: str
    detail: str

    def line(self) -> str:
        return f"{self.status:5} {self.name:9} {self.policy} @ {pct(self.fraction)}: {self.detail}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def pct(fraction: float) -> str:
    """A capacity as given: 0.5 % stays 0.5 %, 10 % is 10 %."""
    return f"{fraction * 100:.6g}%"


def gaps_closed(runs: Sequence[PolicyRun], refs: Sequence[Reference]) -> list[dict[str, Any]]:
    """Per run, its token hit rate beside the references at its capacity and the share of the gap closed."""
    by = {r.fraction: r for r in refs}
    out = []
    for run in runs:
        ref = by.get(run.fraction)
        if ref is not None:
            out.append(
                {
                    "policy": run.policy,
                    "fraction": run.fraction,
                    "token_hit_rate": run.token_hit_rate,
                    "lru": ref.lru,
                    "optimum": ref.optimum_bypass,
                    "gap_closed": ref.closed(run.token_hit_rate),
                }
            )
    return out


def _closed(ref: Reference | None, run: PolicyRun) -> str:
    share = None if ref is None else ref.closed(run.token_hit_rate)
    return "—" if share is None else f"{share:+.1%}"


def render_references(refs: Sequence[Reference], runs: Sequence[PolicyRun], console: Console) -> None:
    """Per capacity: the reference LRU, the optimum without and with bypass, and each policy's token hit
    rate with the share of the LRU → optimum gap it closes."""
    policies = list(dict.fromkeys(r.policy for r in runs))
    by = {(r.policy, r.fraction): r for r in runs}
    columns = ["capacity", "blocks", "lru (reference)", "optimum", "optimum + bypass"]
    columns += [f"{p} (gap closed)" for p in policies]
    rows = []
    for ref in refs:
        row = [
            pct(ref.fraction),
            f"{ref.blocks:,}",
            _pct(ref.lru),
            _pct(ref.optimum),
            _pct(ref.optimum_bypass),
        ]
        for p in policies:
            run = by.get((p, ref.fraction))
            row.append("—" if run is None else f"{_pct(run.token_hit_rate)} ({_closed(ref, run)})")
        rows.append(row)
    console.print(
        _table("token hit rate against the references (gap: lru → optimum + bypass)", columns, rows)
    )


def _protected(run: PolicyRun, work: Workload, cap: float) -> Target:
    t = run.tally(PROTECTED)
    limit = int(cap * run.capacity_bytes)
    if not t.possible:
        return Target("protected", run.policy, run.fraction, "n/a", "no protected block was asked for twice")
    if work.protected_bytes > limit:
        return Target(
            "protected",
            run.policy,
            run.fraction,
            "n/a",
            f"protected set {human_bytes(work.protected_bytes)} > cap {human_bytes(limit)} "
            f"({t.hits}/{t.possible} possible hits)",
        )
    status = MET if t.hits == t.possible else SHORT
    return Target("protected", run.policy, run.fraction, status, f"{t.hits}/{t.possible} possible hits")


def _important(run: PolicyRun, base: PolicyRun) -> Target:
    """≥ 1.5× lru's hit rate; n/a where that is more than an unbounded vault hits (nothing can reach it)."""
    t = run.tally(IMPORTANT_GROUP)
    mine, theirs, ceiling = t.hit_rate, base.tally(IMPORTANT_GROUP).hit_rate, t.ceiling_rate
    if mine is None or theirs is None or ceiling is None:
        return Target("important", run.policy, run.fraction, "n/a", "no block of importance ≥ 0.7")
    factor = mine / theirs if theirs else (float("inf") if mine else 0.0)
    detail = f"{_pct(mine)} vs lru {_pct(theirs)} = {factor:.2f}×"
    if IMPORTANT_FACTOR * theirs > ceiling:
        detail += f" ({IMPORTANT_FACTOR}× lru's is above the {_pct(ceiling)} an unbounded vault hits)"
        return Target("important", run.policy, run.fraction, "n/a", detail)
    status = MET if factor >= IMPORTANT_FACTOR - 1e-9 else SHORT  # 0.6 / 0.4 is 1.4999…
    return Target("important", run.policy, run.fraction, status, f"{detail} (target ≥ {IMPORTANT_FACTOR}×)")


def _overall(run: PolicyRun, base: PolicyRun) -> Target:
    mine, theirs = run.token_hit_rate or 0.0, base.token_hit_rate or 0.0
    status = MET if mine >= theirs * (1 - OVERALL_SLACK) else SHORT
    diff = (mine - theirs) * 100
    word = "above" if diff > 0 else "below" if diff < 0 else "equal to"
    detail = f"{_pct(mine)} vs lru {_pct(theirs)} ({abs(diff):.1f} points {word}; target ≥ 95% of lru's)"
    return Target("overall", run.policy, run.fraction, status, detail)


def targets(runs: Sequence[PolicyRun], work: Workload, cap: float) -> list[Target]:
    """Every target for every non-``lru`` run that has an ``lru`` run at its capacity."""
    base = {r.fraction: r for r in runs if r.policy == "lru"}
    found: list[Target] = []
    for run in runs:
        lru = base.get(run.fraction)
        if run.policy == "lru" or lru is None:
            continue
        found += [_protected(run, work, cap), _important(run, lru), _overall(run, lru)]
    return found


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def render_workload(work: Workload, summary: Mapping[str, Any], console: Console) -> None:
    ceiling = work.ceiling()
    rows = [
        [name, f"{t.blocks:,}", f"{t.possible:,}", _pct(t.ceiling_rate)]
        for name, t in sorted(ceiling.items(), key=lambda kv: (kv[0] != ALL, kv[0]))
    ]
    head = (
        f"{summary['requests']:,} requests, {summary['tenants']} tenants, {summary['agents']} agents, "
        f"{summary['sessions']} sessions, {work.prompt_tokens:,} prompt tokens; working set "
        f"{work.distinct:,} blocks = {human_bytes(work.working_set_bytes)} "
        f"(protected {human_bytes(work.protected_bytes)})"
    )
    console.print(head)
    console.print(
        _table(
            "block lookups per class (ceiling: an unbounded vault)",
            ["class", "lookups", "reusable", "ceiling"],
            rows,
        )
    )


def render_runs(runs: Sequence[PolicyRun], refs: Sequence[Reference], console: Console) -> None:
    by = {r.fraction: r for r in refs}
    columns = [
        "policy @ capacity",
        "token hit",
        "gap closed",
        "block hit",
        "imp ≥ 0.7",
        "protected",
        "of possible",
        "prefill saved",
        "written",
        "evicted",
        "time",
    ]
    rows = []
    for r in runs:
        overall = r.tally(ALL)
        rows.append(
            [
                f"{r.policy} @ {pct(r.fraction)}" + (" (in process)" if r.in_process else ""),
                _pct(r.token_hit_rate),
                _closed(by.get(r.fraction), r),
                _pct(overall.hit_rate),
                _pct(r.tally(IMPORTANT_GROUP).hit_rate),
                _pct(r.tally(PROTECTED).hit_rate),
                _pct(overall.of_possible),
                f"{r.hit_tokens:,} tok / {r.prefill_s_saved:,.1f} s",
                human_bytes(r.bytes_written),
                f"{human_bytes(r.evicted_bytes)} ({r.evictions:,})",
                f"{r.seconds:.1f} s",
            ]
        )
    console.print(_table("hit rates per policy and capacity", columns, rows))


def _written(run: PolicyRun, name: str) -> str:
    text = human_bytes(run.tally(name).stored * run.blob_bytes)
    kept = run.kept(name)
    return text if kept is None else f"{text} ({human_bytes(kept)} kept)"


def render_classes(runs: Sequence[PolicyRun], ceiling: Mapping[str, Tally], console: Console) -> None:
    """One table per capacity: per class and policy the block hit rate (beside an unbounded vault's) and
    the bytes put, with what the vault still holds at the end where it knows the classes."""
    names = sorted(n for n in ceiling if n != ALL)
    for fraction in sorted({r.fraction for r in runs}):
        here = [r for r in runs if r.fraction == fraction]
        columns = ["class", "unbounded"]
        columns += [f"{r.policy} {what}" for r in here for what in ("hit", "written")]
        rows = [
            [
                n,
                _pct(ceiling[n].ceiling_rate),
                *(v for r in here for v in (_pct(r.tally(n).hit_rate), _written(r, n))),
            ]
            for n in names
        ]
        console.print(_table(f"per class at {pct(fraction)} capacity", columns, rows))


def render_prefetch(doc: Mapping[str, Any], console: Console) -> None:
    """The prefetch on/off comparison (:mod:`.prefetch`)."""

    def ms(v: float | None) -> str:
        return "—" if v is None else f"{v:.2f} ms"

    med = doc["median_restore_ms"]
    rows = [
        ["restores (requests restored on both sides)", f"{doc['restores']:,}"],
        ["blocks restored on / off", f"{doc['blocks_restored']['on']:,} / {doc['blocks_restored']['off']:,}"],
        [
            "blocks from prefetch",
            f"{doc['blocks_from_prefetch']:,} ({_pct(doc['block_share_from_prefetch'])})",
        ],
        [
            "bytes from prefetch",
            f"{human_bytes(doc['bytes_from_prefetch'])} ({_pct(doc['byte_share_from_prefetch'])})",
        ],
        ["median restore on / off", f"{ms(med['on'])} / {ms(med['off'])}"],
        ["median saving per request", ms(doc["median_saved_ms"])],
        [
            "prefetched / wasted",
            f"{human_bytes(doc['prefetched_bytes'])} / {human_bytes(doc['wasted_bytes'])}",
        ],
        [
            "prefetch jobs / gave up / dropped",
            f"{doc['prefetch']['jobs']} / {doc['prefetch']['gave_up']} / {doc['prefetch']['dropped']}",
        ],
    ]
    title = (
        f"prefetch on/off @ {pct(doc['fraction'])} capacity, buffer {human_bytes(doc['buffer_bytes'])}, "
        f"{doc['gap_s'] * 1e3:.0f} ms between requests"
    )
    console.print(_table(title, ["", "value"], rows))


def render_targets(found: Sequence[Target], console: Console) -> None:
    colour = {MET: "green", SHORT: "yellow"}
    for t in found:
        style = colour.get(t.status, "dim")
        console.print(f"[{style}]{t.line()}[/{style}]", highlight=False)


def _series(runs: Sequence[PolicyRun], metric: str) -> dict[str, tuple[list[float], list[float]]]:
    lines: dict[str, tuple[list[float], list[float]]] = {}
    for r in sorted(runs, key=lambda r: r.fraction):
        value = r.token_hit_rate if metric == "tokens" else r.tally(metric).hit_rate
        if value is not None:
            xs, ys = lines.setdefault(r.policy, ([], []))
            xs.append(r.fraction * 100)
            ys.append(value * 100)
    return lines


PANELS: Final = (
    ("tokens", "overall token hit rate"),
    (IMPORTANT_GROUP, "blocks of importance ≥ 0.7"),
    (PROTECTED, "protected blocks (axioms, identity, rules)"),
)


def _reference_lines(ax: Any, refs: Sequence[Reference]) -> None:
    xs = [r.fraction * 100 for r in refs]
    ax.plot(xs, [r.lru * 100 for r in refs], color="black", linestyle=":", label="lru (reference)")
    ax.plot(xs, [r.optimum_bypass * 100 for r in refs], color="black", linestyle="-.", label="optimum")


def write_chart(
    runs: Sequence[PolicyRun], work: Workload, path: Path, title: str, refs: Sequence[Reference] = ()
) -> str | None:
    """Hit rate against capacity, one line per policy, one panel per metric (PNG, or SVG by suffix); the
    dashed line is an unbounded vault, the dotted and dash-dotted ones the reference LRU and the optimum
    (token panel). A trace with no tags has the token panel only. Returns why not when matplotlib is
    missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "chart skipped: matplotlib is not installed (pip install 'tierkv[bench]')"
    ceiling = work.ceiling()
    panels = PANELS if any(r.tagged for r in work.requests) else PANELS[:1]
    fig = Figure(figsize=(4.6 * len(panels) + 2.4, 4.4), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, (metric, label) in zip(axes, panels, strict=True):
        for policy, (xs, ys) in _series(runs, metric).items():
            ax.plot(xs, ys, marker="o", label=policy)
        if metric == "tokens" and refs:
            _reference_lines(ax, sorted(refs, key=lambda r: r.fraction))
        top = work.prompt_tokens and ceiling[ALL].possible * work.block_tokens / work.prompt_tokens
        bound = top if metric == "tokens" else ceiling.get(metric, Tally()).ceiling_rate
        if bound:
            ax.axhline(bound * 100, color="grey", linestyle="--", linewidth=1, label="unbounded vault")
        ax.set_title(label)
        ax.set_xlabel("vault capacity (% of working set)")
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("hit rate (%)")
    axes[0].legend(loc="best", fontsize="small")
    fig.suptitle(title, fontsize="medium")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return None


__all__ = [
    "Target",
    "gaps_closed",
    "pct",
    "render_classes",
    "render_references",
    "render_runs",
    "render_targets",
    "render_workload",
    "targets",
    "write_chart",
]
