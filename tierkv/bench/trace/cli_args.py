"""Flag text of ``tierkv bench trace`` → :class:`~tierkv.bench.trace.run.TraceSettings`.

Every parser raises :class:`BenchError` naming the flag, so the command exits 2 with one line.
"""

from __future__ import annotations

from pathlib import Path

from tierkv.bench.runner import model_shape
from tierkv.bench.trace.blocksize import MAX_BLOCK_TOKENS
from tierkv.bench.trace.conversations import SHAPES, ConversationSpec
from tierkv.bench.trace.generate import TraceSpec
from tierkv.bench.trace.hashids import DEFAULT_BLOCK_TOKENS
from tierkv.bench.trace.prefetch import PrefetchSettings
from tierkv.bench.trace.reader import ReadOptions
from tierkv.bench.trace.replay import LEASE_MS, ReplaySettings
from tierkv.bench.trace.run import TraceSettings
from tierkv.config import parse_size
from tierkv.errors import BenchError


def parse_fractions(text: str) -> tuple[float, ...]:
    """``--capacities``: ``10%,30%`` or ``0.1,0.3``."""
    values: list[float] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            values.append(float(part[:-1]) / 100 if part.endswith("%") else float(part))
        except ValueError:
            raise BenchError(f"--capacities: expected fractions like 10% or 0.1, got {part!r}") from None
    return tuple(values)


def _blob_bytes(text: str | None, default: int) -> int:
    if text is None:
        return default
    try:
        return parse_size(text)
    except ValueError as exc:
        raise BenchError(f"--blob-bytes: {exc}") from None


def _path(text: str | None) -> Path | None:
    return Path(text).expanduser() if text else None


def chart_path(chart: str | None, json_out: str | None) -> Path | None:
    """``--chart``, else the ``--json`` file with a .png suffix (none when the JSON goes to stdout)."""
    if chart:
        return Path(chart).expanduser()
    if json_out and json_out != "-":
        return Path(json_out).expanduser().with_suffix(".png")
    return None


def trace_settings(
    *,
    spec: TraceSpec,
    trace_file: str | None,
    write_trace: str | None,
    policies: str,
    capacities: str,
    block_tokens: int,
    shape: str,
    blob_bytes: str | None,
    prefill_tps: float,
    protected_cap: float,
    chart: str | None,
    json_out: str | None,
    max_seconds: float,
    state_dir: str | None,
    vault_sync: str,
    prefetch: str | None = None,
    prefetch_gap_ms: float = 50.0,
    prefetch_only: bool = False,
    min_turnover: int = 0,
    workload: str = "agent",
    requests: int = 4000,
    trace_block_tokens: str = "auto",
    speedup: float = 0.0,
    in_process: bool = False,
    lease_ms: int = LEASE_MS,
    trace_format: str = "auto",
    timestamp_unit: str = "auto",
    max_requests: int | None = None,
    keep_order: bool = False,
) -> TraceSettings:
    model = model_shape(shape)
    if block_tokens < 1:
        raise BenchError("--block-tokens must be positive")
    hash_block_tokens = parse_block_tokens(trace_block_tokens)
    reading = ReadOptions(hash_block_tokens, trace_format, timestamp_unit, max_requests, keep_order)
    generated = hash_block_tokens or DEFAULT_BLOCK_TOKENS
    replay = ReplaySettings(
        policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
        capacities=parse_fractions(capacities),
        block_tokens=block_tokens,
        blob_bytes=_blob_bytes(blob_bytes, model.kv_bytes_per_token * block_tokens),
        prefill_tps=prefill_tps,
        sync=vault_sync,
        state_dir=_path(state_dir),
        max_seconds=max_seconds,
        model=model.name,
        protected_cap=protected_cap,
        min_turnover=min_turnover,
        speedup=speedup,
        lease_ms=lease_ms,
    )
    return TraceSettings(
        conversations=_conversations(workload, spec.seed, requests, generated),
        reading=reading,
        blob_bytes_given=blob_bytes is not None,
        in_process=in_process,
        spec=spec,
        replay=replay,
        trace_file=_path(trace_file),
        write_trace=_path(write_trace),
        chart=chart_path(chart, json_out),
        prefetch=_prefetch(prefetch, prefetch_gap_ms, prefetch_only),
        prefetch_only=prefetch_only,
    )


def parse_block_tokens(text: str) -> int | None:
    """``--trace-block-tokens``: ``auto`` (None: found from the trace's lines) or a positive count."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise BenchError(f"--trace-block-tokens: expected auto or a token count, got {text!r}") from None
    if not 1 <= value <= MAX_BLOCK_TOKENS:
        raise BenchError(f"--trace-block-tokens: expected 1..{MAX_BLOCK_TOKENS} tokens, got {value}")
    return value


def _conversations(workload: str, seed: int, requests: int, block_tokens: int) -> ConversationSpec | None:
    """``--workload``: ``agent`` (the tagged agent trace), or a hash-id shape (:mod:`.conversations`)."""
    if workload == "agent":
        return None
    if workload not in SHAPES:
        raise BenchError(f"--workload: expected agent or one of {', '.join(SHAPES)}, got {workload!r}")
    return ConversationSpec(shape=workload, seed=seed, requests=requests, block_tokens=block_tokens)


def _prefetch(size: str | None, gap_ms: float, only: bool) -> PrefetchSettings | None:
    """``--prefetch SIZE`` (the buffer) and ``--prefetch-gap-ms``; ``--prefetch-only`` needs a size."""
    if size is None:
        if only:
            raise BenchError("--prefetch-only needs --prefetch SIZE (the prefetch buffer, e.g. 64MiB)")
        return None
    try:
        buffer = parse_size(size)
    except ValueError as exc:
        raise BenchError(f"--prefetch: {exc}") from None
    if buffer <= 0 or not gap_ms >= 0:
        raise BenchError("--prefetch must be a positive size and --prefetch-gap-ms at least 0")
    return PrefetchSettings(buffer_bytes=buffer, gap_s=gap_ms / 1e3)


__all__ = ["chart_path", "parse_block_tokens", "parse_fractions", "trace_settings"]
