"""Rich tables for bench results; every figure shown here is also in the ``--json`` document."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from tierkv.bench.breakeven import BreakEven
from tierkv.bench.record import RunMeta
from tierkv.status import human_bytes

if TYPE_CHECKING:
    from tierkv.bench.engine import EngineResult
    from tierkv.bench.hf import HFResult
    from tierkv.bench.synthetic import SyntheticResult

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


def render_synthetic(result: SyntheticResult, console: Console) -> None:
    s = result.settings
    shape = s.shape
    head = f"{shape.name}: {shape.kv_bytes_per_token:,} KV bytes/token ({shape.dtype})"
    if shape.ssm_layers:
        head += f", {human_bytes(shape.ssm_bytes_per_snapshot)} state snapshot every {s.ssm_every} tokens"
    console.print(f"[bold]tierkv bench[/bold] — {head}; blocks of {s.block_tokens} tokens")

    codecs = Table(title="codecs (on the workload's values)")
    for col in ("codec", "compression", "SNR dB", "max abs error", "blob / block"):
        codecs.add_column(col, justify="left" if col == "codec" else "right")
    for q in result.quality.values():
        codecs.add_row(
            q["codec"],
            f"{q['compression']:.2f}×",
            "lossless" if q["lossless"] else _f(q["snr_db"], ".1f"),
            _f(q["max_abs_error"], ".3g"),
            human_bytes(q["blob_bytes"]),
        )
    console.print(codecs)

    table = Table(title="store and restore through the vaults (KV GB/s = bytes in the model's dtype)")
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
        "lookup ms",
        "verified",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "codec" else "right")
    for cell in result.cells:
        f = cell.figures()
        if not cell.complete:
            verified = "[red]no[/red]"
        elif cell.bit_exact:
            verified = "bit-exact"
        else:
            verified = "checksums"
        table.add_row(
            f"{cell.tokens:,}",
            cell.codec,
            human_bytes(cell.kv_bytes),
            f"{f['stored_bytes_per_token']:,.0f}",
            _f(f["store_gbps"]),
            f"{_f(f['store_batch_ms_p50'], '.1f')} / {_f(f['store_batch_ms_p99'], '.1f')}",
            _f(f["restore_gbps"]),
            f"{_f(f['restore_batch_ms_p50'], '.1f')} / {_f(f['restore_batch_ms_p99'], '.1f')}",
            _f(f["restore_tokens_per_s"], ",.0f"),
            _f(f["lookup_ms_median"], ".2f"),
            verified,
        )
    console.print(table)
    render_vaults(result.vaults, console)
    render_breakeven(result.breakeven, console)
    render_meta(result.meta, console)
    render_footer(result.warnings, result.errors, result.verdict, result.ok, console)


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
    table = Table(
        title="break-even: restore vs recompute (savings beyond the measured lengths are extrapolated)"
    )
    for col in ("path", "prefill model", "restore model", "restore wins above"):
        table.add_column(col)
    first = next(iter(breakeven.values()))
    for s in first.savings:
        table.add_column(f"saved at {s.tokens // 1024}k", justify="right")
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
        table.add_row(name, be.prefill.basis, rmodel, wins, *cells)
    console.print(table)
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


def render_footer(warnings: list[str], errors: list[str], verdict: str, ok: bool, console: Console) -> None:
    for w in warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
    for e in errors:
        console.print(f"[red]error:[/red] {e}")
    color = "green" if ok else "red"
    console.print(f"[bold {color}]{verdict}[/bold {color}]")


def render_hf(result: HFResult, console: Console) -> None:
    s = result.settings
    console.print(
        f"[bold]tierkv bench --hf[/bold] — random-weight {result.model_desc} on {s.device}, "
        f"codec {s.codec}, blocks of {s.block_tokens} tokens"
    )
    table = Table(title="time to first token (median over repeats)")
    for col in (
        "tokens",
        "prefill (cold)",
        "prefill tokens/s",
        "hot hit",
        "cold restore",
        "restored tokens",
        "fetched",
        "network / decode / inject",
        "speedup",
    ):
        table.add_column(col, justify="right")
    for row in result.rows:
        f = row.figures()
        table.add_row(
            f"{row.tokens:,}",
            _seconds(f["prefill_ttft_s"]),
            _f(f["prefill_tokens_per_s"], ",.0f"),
            _seconds(f["hot_ttft_s"]),
            _seconds(f["restore_ttft_s"]),
            f"{row.restored_tokens:,}",
            human_bytes(row.bytes_fetched),
            " / ".join(_seconds(f[k]) for k in ("network_s", "codec_s", "inject_s")),
            f"{_f(f['speedup'], '.1f')}×",
        )
    console.print(table)
    render_vaults(result.vaults, console)
    render_breakeven(result.breakeven, console)
    render_meta(result.meta, console)
    render_footer(result.warnings, result.errors, result.verdict, result.ok, console)


def render_engine(result: EngineResult, console: Console) -> None:
    s = result.settings
    console.print(
        f"[bold]tierkv bench --engine-api[/bold] {s.url} — model {result.model}, {result.api} API, "
        f"eviction by {result.evict_method}"
    )
    table = Table(title="streamed time to first token (median over repeats)")
    for col in (
        "tokens",
        "cold",
        "hot (engine prefix cache)",
        "restored (after eviction)",
        "speedup",
        "cached tokens",
    ):
        table.add_column(col, justify="right")
    for row in result.rows:
        f = row.figures()
        cached = row.cached_tokens_restored
        table.add_row(
            f"{row.prompt_tokens:,}" if row.prompt_tokens else f"~{row.target_tokens:,}",
            _seconds(f["cold_ttft_s"]),
            _seconds(f["hot_ttft_s"]),
            _seconds(f["restored_ttft_s"]),
            f"{_f(f['speedup'], '.1f')}×",
            "—" if cached is None else f"{cached:,}",
        )
    console.print(table)
    render_breakeven(result.breakeven, console)
    render_meta(result.meta, console)
    render_footer(result.warnings, result.errors, result.verdict, result.ok, console)


__all__ = [
    "render_breakeven",
    "render_engine",
    "render_footer",
    "render_hf",
    "render_synthetic",
    "render_vaults",
]
