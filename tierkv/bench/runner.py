"""One entry point for the ``tierkv bench`` command: pick the mode, fill in its defaults, run, render.

The command line hands over a :class:`BenchRequest` (flags as given, ``None`` where the user left a
per-mode default); :func:`run_bench` builds the mode's settings, runs it and returns its result, whose
``document()`` is the ``--json`` output and whose ``ok`` is the exit status.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from tierkv.bench import BenchError
from tierkv.bench.breakeven import PrefillModel
from tierkv.bench.shapes import parse_shape
from tierkv.bench.vaults import VaultSettings
from tierkv.config import Config, parse_size

logger = logging.getLogger(__name__)

DEFAULTS: dict[str, dict[str, Any]] = {
    "synthetic": {"tokens": (1024, 4096, 16384), "repeats": 3, "max_seconds": 120.0},
    "hf": {"tokens": (512, 2048), "repeats": 2, "max_seconds": 300.0},
    "engine": {"tokens": (1024, 4096), "repeats": 3, "max_seconds": 900.0},
}


class BenchResult(Protocol):
    @property
    def ok(self) -> bool: ...

    verdict: str

    def document(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """What the user asked for; ``None`` means the mode's default."""

    shape: str = "qwen2.5-0.5b"
    tokens: str | None = None
    codecs: str = "raw,int8"
    repeats: int | None = None
    block_tokens: int = 16
    batch_mib: float = 16.0
    ssm_every: int = 1024
    max_seconds: float | None = None
    prefill_tps: float | None = None
    prefill_at: int | None = None
    vaults: str = "auto"
    state_dir: str | None = None
    vault_max_bytes: str = "1GiB"
    vault_sync: str = "durable"
    hf: bool = False
    device: str = "cpu"
    engine_api: str | None = None
    model: str | None = None
    api: str = "auto"
    evict: str = "auto"
    flood_tokens: int = 65536
    settle_s: float = 1.0
    max_new_tokens: int = 4
    min_speedup: float | None = None
    seed: int = 0

    @property
    def mode(self) -> str:
        if self.hf and self.engine_api:
            raise BenchError("--hf and --engine-api are separate modes: pick one")
        return "hf" if self.hf else "engine" if self.engine_api else "synthetic"

    def lengths(self) -> tuple[int, ...]:
        if self.tokens is None:
            return tuple(DEFAULTS[self.mode]["tokens"])
        try:
            values = tuple(_count(part) for part in self.tokens.split(",") if part.strip())
        except ValueError as exc:
            raise BenchError(f"--tokens: {exc}") from exc
        if not values:
            raise BenchError("--tokens needs at least one length")
        return values

    def default(self, name: str) -> Any:
        value = getattr(self, name)
        return DEFAULTS[self.mode][name] if value is None else value

    def vault_settings(self) -> VaultSettings:
        try:
            budget = parse_size(self.vault_max_bytes)
        except ValueError as exc:
            raise BenchError(f"--vault-max-bytes: {exc}") from exc
        if self.vault_sync not in ("durable", "fast"):
            raise BenchError("--vault-sync must be durable or fast")
        state = Path(self.state_dir).expanduser() if self.state_dir else None
        return VaultSettings(mode=self.vaults, state_dir=state, max_bytes=budget, sync=self.vault_sync)

    def prefill_model(self) -> PrefillModel | None:
        if self.prefill_tps is None:
            return None
        try:
            return PrefillModel.from_rate(self.prefill_tps, self.prefill_at)
        except ValueError as exc:
            raise BenchError(f"--prefill-tps: {exc}") from exc


def _count(text: str) -> int:
    """``4096``, ``4k`` or ``32K`` (k = 1024, tokens are counted in powers of two)."""
    t = text.strip().lower()
    value = int(t[:-1]) * 1024 if t.endswith("k") else int(t)
    if value < 1:
        raise ValueError(f"lengths must be positive, got {text!r}")
    return value


def run_bench(request: BenchRequest, config: Config, console: Console) -> BenchResult:
    """Run the requested mode; setup problems raise :class:`BenchError`, measurement ones go to ``errors``."""
    mode = request.mode
    try:
        shape = parse_shape(request.shape)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    codecs = tuple(c.strip() for c in request.codecs.split(",") if c.strip())
    if mode == "engine":
        from tierkv.bench.engine import EngineSettings, run_engine

        assert request.engine_api is not None
        return run_engine(
            EngineSettings(
                url=request.engine_api,
                model=request.model,
                lengths=request.lengths(),
                repeats=request.default("repeats"),
                max_tokens=request.max_new_tokens,
                api=request.api,
                evict=request.evict,
                flood_tokens=request.flood_tokens,
                settle_s=request.settle_s,
                max_seconds=request.default("max_seconds"),
                min_speedup=request.min_speedup,
                seed=request.seed,
            ),
            console,
        )
    if mode == "hf":
        from tierkv.bench.hf import HFSettings, run_hf

        return run_hf(
            config,
            HFSettings(
                shape=shape,
                lengths=request.lengths(),
                repeats=request.default("repeats"),
                device=request.device,
                codec=codecs[0] if codecs else "raw",
                block_tokens=request.block_tokens,
                max_seconds=request.default("max_seconds"),
                min_speedup=request.min_speedup,
                seed=request.seed,
            ),
            request.vault_settings(),
            console,
        )
    from tierkv.bench.synthetic import SyntheticSettings, run_synthetic

    return run_synthetic(
        config,
        SyntheticSettings(
            shape=shape,
            lengths=request.lengths(),
            codecs=codecs,
            repeats=request.default("repeats"),
            block_tokens=request.block_tokens,
            batch_bytes=max(1, int(request.batch_mib * (1 << 20))),
            ssm_every=request.ssm_every,
            max_seconds=request.default("max_seconds"),
            prefill=request.prefill_model(),
            seed=request.seed,
        ),
        request.vault_settings(),
        console,
    )


def render_result(result: BenchResult, console: Console) -> None:
    from tierkv.bench.engine import EngineResult
    from tierkv.bench.hf import HFResult
    from tierkv.bench.render import render_engine, render_hf, render_synthetic
    from tierkv.bench.synthetic import SyntheticResult

    if isinstance(result, EngineResult):
        render_engine(result, console)
    elif isinstance(result, HFResult):
        render_hf(result, console)
    elif isinstance(result, SyntheticResult):
        render_synthetic(result, console)
    else:
        raise TypeError(f"no renderer for {type(result).__name__}")


__all__ = ["DEFAULTS", "BenchRequest", "BenchResult", "render_result", "run_bench"]
