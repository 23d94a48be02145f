"""Rich tables for bench results; every figure shown here is also in the ``--json`` document."""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tierkv.bench.breakeven import BreakEven
from tierkv.bench.common import BenchRun
from tierkv.bench.record import RunMeta
from tierkv.config import human_bytes

if TYPE_CHECKING:
    from tierkv.bench.engine import EngineResult, EngineRow
    from tierkv.bench.hf import HFResult, HFRow
    from tierkv.bench.synthetic import CellResult, SyntheticResult

logger = logging.getLogger(__name__)


def _f(value: float | None, fmt: str = ".2f", dash: str = "—") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return dash
    if math.isinf(value):
        return "∞"
    return format(value, fmt)


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms" if value >= 0.01 else f"{value * 1000:.1f} ms"
    return f"{value:.2f} s" if value < 100 else f"{value:,.0f} s"


def _table(
    title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], left: Collection[str] = ()
) -> Table:
    """Figures right-aligned, the ``left`` columns (names, not numbers) left-aligned."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f}%"


def _times(value: float | None, fmt: str = ".1f") -> str:
    return f"{_f(value, fmt)}×"


def _closing(result: BenchRun, console: Console, vaults: Mapping[str, Any] | None = None) -> None:
    """What every mode prints after its own tables: vault counters, break-even, context, verdict."""
    if vaults is not None:
        render_vaults(vaults, console)
    render_breakeven(result.breakeven, console)
    render_meta(result.meta, console)
    render_footer(result, console)


def render_synthetic(result: SyntheticResult, console: Console) -> None:
    s = result.settings
    shape = s.shape
    head = f"{shape.name}: {shape.kv_bytes_per_token:,} KV bytes/token ({shape.dtype})"
    if shape.ssm_layers:
        head += f", {human_bytes(shape.ssm_bytes_per_snapshot)} state snapshot every {s.ssm_every} tokens"
    if "int8" in s.codecs:
        head += f"; int8 decoded with {result.decoder}"
    console.print(f"[bold]tierkv bench synthetic[/bold] — {head}; blocks of {s.block_tokens} tokens")
    if s.link is not None:
        console.print(
            f"over an emulated link: {s.link.label()} (veth between network namespaces, shaped with htb"
            + ("; the round trip waited once per request)" if s.link.rtt_s else ")")
        )
    console.print(
        _table(
            "codecs (on the workload's values)",
            ("codec", "compression", "SNR dB", "max abs error", "blob / block"),
            (
                (
                    q["codec"],
                    f"{q['compression']:.2f}×",
                    "lossless" if q["lossless"] else _f(q["snr_db"], ".1f"),
                    _f(q["max_abs_error"], ".3g"),
                    human_bytes(q["blob_bytes"]),
                )
                for q in result.quality.values()
            ),
            left=("codec",),
        )
    )
    cols = (
        "tokens",
        "codec",
        "KV",
        "stored B/token",
        "store GB/s",
        "store batch p50/p99 ms",
        "restore GB/s",
        "restore batch p50/p99 ms",
        "restore tokens/s",
        "ms / 1k tokens",
        "lookup ms",
        "verified",
    )
    title = "store and restore through the vaults (KV GB/s = bytes in the model's dtype)"
    console.print(_table(title, cols, map(_cell_row, result.cells), left=("codec",)))
    _closing(result, console, result.vaults)


def _cell_row(cell: CellResult) -> tuple[str, ...]:
    f = cell.figures()
    if not cell.complete:
        verified = "[red]no[/red]"
    elif cell.bit_exact:
        verified = "bit-exact"
    else:
        verified = "checksums"
    return (
        f"{cell.tokens:,}",
        cell.contender,
        human_bytes(cell.kv_bytes),
        f"{f['stored_bytes_per_token']:,.0f}",
        _f(f["store_gbps"]),
        _p50_p99(f, "store"),
        _f(f["restore_gbps"]),
        _p50_p99(f, "restore"),
        _f(f["restore_tokens_per_s"], ",.0f"),
        _f(f["restore_ms_per_1k_tokens"], ".1f"),
        _f(f["lookup_ms_median"], ".2f"),
        verified,
    )


def _p50_p99(figures: Mapping[str, Any], what: str) -> str:
    return f"{_f(figures[f'{what}_batch_ms_p50'], '.1f')} / {_f(figures[f'{what}_batch_ms_p99'], '.1f')}"


def render_vaults(vaults: Mapping[str, Any], console: Console) -> None:
    if not vaults:
        return
    delta = vaults.get("delta", {})
    where = "; ".join(f"{role} {', '.join(addrs)}" for role, addrs in vaults.get("addresses", {}).items())
    line = (
        f"vaults ({vaults.get('source')}: {where}) during the run: {delta.get('hits', 0):,} hits, "
        f"{delta.get('misses', 0):,} misses, {delta.get('evictions', 0):,} evictions, "
        f"{human_bytes(delta.get('bytes_in', 0))} in, {human_bytes(delta.get('bytes_out', 0))} out"
    )
    if delta.get("corrupt"):
        line += f", [red]{delta['corrupt']} corrupt[/red]"
    console.print(line)
    for note in vaults.get("notes", []):
        console.print(f"  [dim]{note}[/dim]")


def render_breakeven(breakeven: Mapping[str, BreakEven], console: Console) -> None:
    if not breakeven:
        return
    first = next(iter(breakeven.values()))
    cols = (
        "path",
        "prefill model",
        "restore model",
        "restore wins above",
        *(f"saved at {s.tokens // 1024}k" for s in first.savings),
    )
    rows = []
    for name, be in breakeven.items():
        r = be.restore
        rmodel = f"{_seconds(r.fixed_s)} + n / {r.tokens_per_s:,.0f} tok/s"
        if r.bytes_per_s is not None:
            rmodel += f" ({r.bytes_per_s / 1e9:.2f} GB/s)"
        wins = "never" if be.tokens is None else f"{be.tokens:,} tokens"
        cells = [
            f"{_seconds(s.saved_s)} ({_f(s.speedup, '.0f')}×)" if s.saved_s > 0 else "[red]loses[/red]"
            for s in be.savings
        ]
        rows.append((name, be.prefill.basis, rmodel, wins, *cells))
    title = "break-even: restore vs recompute (savings beyond the measured lengths are extrapolated)"
    console.print(_table(title, cols, rows, left=cols[:4]))
    if first.common_s:
        console.print(
            f"  [dim]both models are net of {_seconds(first.common_s)} that every request pays alike "
            "(the hot-hit TTFT: request, last token, sampling); the savings columns include it[/dim]"
        )


def render_meta(meta: RunMeta, console: Console) -> None:
    """One line of context, so a pasted table still says where it was measured."""
    m, v = meta.machine, meta.versions
    memory = human_bytes(m["memory_bytes"]) if m.get("memory_bytes") else "?"
    where = f"{m.get('processor') or m.get('machine')}, {m.get('cpus')} CPUs, {memory}"
    if m.get("cuda_device"):
        where += f", {m['cuda_device']}"
    soft = ", ".join(f"{k} {v[k]}" for k in ("tierkv", "python", "torch", "transformers") if k in v)
    console.print(f"[dim]{where}; {soft}; {meta.started_at}, {meta.duration_s:.1f} s[/dim]")


def render_footer(result: BenchRun, console: Console) -> None:
    for w in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    for e in result.errors:
        console.print(f"[red]error:[/red] {escape(e)}")
    color = "green" if result.ok else "red"
    console.print(f"[bold {color}]{result.verdict}[/bold {color}]")


def render_hf(result: HFResult, console: Console) -> None:
    s = result.settings
    console.print(
        f"[bold]tierkv bench hf[/bold] — random-weight {result.model_desc} on {s.device}, "
        f"codec {s.codec}, blocks of {s.block_tokens} tokens"
    )
    console.print(
        _table(
            "time to first token (median over repeats)",
            ("tokens", "prefill", "prefill tok/s", "hot hit", "cold restore", "speedup"),
            map(_ttft_row, result.rows),
        )
    )
    cols = (
        "tokens",
        "restored",
        "fetched",
        "restore",
        "network",
        "codec",
        "inject",
        "restore tok/s",
        "data plane GB/s",
        "restore ÷ data plane",
    )
    console.print(
        _table("the cold restore itself (median over repeats)", cols, map(_restore_row, result.rows))
    )
    console.print(
        "  [dim]restore = lookup + BatchGet (network), verify + decode (codec), building the cache (inject);"
        " the rest of its TTFT is the forward pass over the tokens after the last block.\n"
        "  Data plane = the same BatchGet replayed bare; restore ÷ data plane = restore time over the time"
        " its bytes need there.[/dim]"
    )
    met = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "—"}
    console.print(
        _table(
            "targets (checks for the reader; they do not fail the run)",
            ("target", "measured", "met"),
            ((t.goal, t.measured, met[t.met]) for t in result.targets),
            left=("target", "measured"),
        )
    )
    if result.quality:
        q0 = next(iter(result.quality.values()))
        console.print(
            _table(
                f"restore quality vs a full prefill ({q0['prompt_tokens']:,}-token prompt, "
                f"{q0['new_tokens']} greedy tokens; raw = the model's own noise)",
                (
                    "codec",
                    "restored",
                    "greedy agreement",
                    "first divergence",
                    "teacher-forced",
                    "logit error max / mean",
                    "logit scale",
                ),
                (
                    (
                        codec,
                        f"{q['restored_tokens']:,}",
                        _f(q["agreement"], ".3f"),
                        str(q["first_divergence"]),
                        _f(q["teacher_forced_agreement"], ".3f"),
                        f"{_f(q['max_logit_error'], '.4f')} / {_f(q['mean_logit_error'], '.4f')}",
                        _f(q["logit_scale"], ".2f"),
                    )
                    for codec, q in result.quality.items()
                ),
                left=("codec",),
            )
        )
    _closing(result, console, result.vaults)


def _ttft_row(row: HFRow) -> tuple[str, ...]:
    f = row.figures()
    return (
        f"{row.tokens:,}",
        _seconds(f["prefill_ttft_s"]),
        _f(f["prefill_tokens_per_s"], ",.0f"),
        _seconds(f["hot_ttft_s"]),
        _seconds(f["restore_ttft_s"]),
        _times(f["speedup"]),
    )


def _restore_row(row: HFRow) -> tuple[str, ...]:
    f = row.figures()
    return (
        f"{row.tokens:,}",
        f"{row.restored_tokens:,}",
        human_bytes(row.bytes_fetched),
        _seconds(f["restore_s"]),
        *(_pct(f[f"{part}_share"]) for part in ("network", "codec", "inject")),
        _f(f["restore_tokens_per_s"], ",.0f"),
        _f(f["dataplane_gbps"]),
        _times(f["restore_vs_dataplane"], ".2f"),
    )


def render_engine(result: EngineResult, console: Console) -> None:
    s = result.settings
    console.print(
        f"[bold]tierkv bench engine[/bold] {s.url} — model {result.model}, {result.api} API, "
        f"eviction by {result.evict_method}"
    )
    cols = (
        "tokens",
        "cold",
        "hot (engine prefix cache)",
        "restored (after eviction)",
        "speedup",
        "cached tokens",
    )
    console.print(
        _table("streamed time to first token (median over repeats)", cols, map(_engine_row, result.rows))
    )
    _closing(result, console)


def _engine_row(row: EngineRow) -> tuple[str, ...]:
    f = row.figures()
    cached = row.cached_tokens_restored
    return (
        f"{row.prompt_tokens:,}" if row.prompt_tokens else f"~{row.target_tokens:,}",
        _seconds(f["cold_ttft_s"]),
        _seconds(f["hot_ttft_s"]),
        _seconds(f["restored_ttft_s"]),
        _times(f["speedup"]),
        "—" if cached is None else f"{cached:,}",
    )


__all__ = [
    "render_breakeven",
    "render_engine",
    "render_footer",
    "render_hf",
    "render_synthetic",
    "render_vaults",
]
