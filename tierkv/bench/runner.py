"""From flag text to a mode's settings, and from its result to the screen: what the ``tierkv bench``
subcommands share.

Every parser raises :class:`BenchError` naming the flag, so the command exits 2 with one line; the
modes themselves check their settings before anything starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from rich.console import Console

from tierkv.bench import BenchError
from tierkv.bench.breakeven import PrefillModel
from tierkv.bench.link import LinkSpec, link_emulator, parse_link
from tierkv.bench.shapes import ModelShape, parse_shape
from tierkv.bench.vaults import VaultSettings, parse_vaults
from tierkv.config import parse_size


class BenchResult(Protocol):
    @property
    def ok(self) -> bool: ...

    verdict: str

    def document(self) -> dict[str, Any]: ...


def parse_lengths(text: str) -> tuple[int, ...]:
    """``--tokens``: comma-separated prompt lengths, ``4096`` or ``4k`` (k = 1024)."""
    try:
        values = tuple(_count(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise BenchError(f"--tokens: {exc}") from exc
    if not values:
        raise BenchError("--tokens needs at least one length")
    return values


def _count(text: str) -> int:
    """``4096``, ``4k`` or ``32K`` (k = 1024, tokens are counted in powers of two)."""
    t = text.strip().lower()
    digits = t.removesuffix("k")
    if not digits.isdigit():
        raise ValueError(f"expected lengths like 512,4k,16k (k = 1024), got {text.strip()!r}")
    value = int(digits) * (1024 if t.endswith("k") else 1)
    if value < 1:
        raise ValueError(f"lengths must be positive, got {text!r}")
    return value


def parse_codecs(text: str) -> tuple[str, ...]:
    """``--codec``: comma-separated codec names (checked by the mode)."""
    return tuple(c.strip() for c in text.split(",") if c.strip())


def model_shape(text: str) -> ModelShape:
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc


def vault_settings(
    vaults: str, use_config: bool, state_dir: str | None, max_bytes: str, sync: str
) -> VaultSettings:
    """``--vaults`` / ``--use-config-vaults`` and the settings of vaults started here."""
    mode, addresses = parse_vaults(vaults)
    if use_config:
        if mode not in ("local", "config"):
            raise BenchError("--use-config-vaults and --vaults name different vaults: pick one")
        mode = "config"
    try:
        budget = parse_size(max_bytes)
    except ValueError as exc:
        raise BenchError(f"--vault-max-bytes: {exc}") from exc
    if sync not in ("durable", "fast"):
        raise BenchError("--vault-sync must be durable or fast")
    state = Path(state_dir).expanduser() if state_dir else None
    return VaultSettings(mode=mode, state_dir=state, max_bytes=budget, sync=sync, addresses=addresses)


R = TypeVar("R")


def on_link(
    text: str | None, where: VaultSettings, measure: Callable[[VaultSettings, LinkSpec | None], R]
) -> R:
    """Run ``measure`` with its vaults, over the link ``--link`` names (set up here, torn down after,
    whatever happens; see :mod:`tierkv.bench.link.netns`), or as asked when it names none."""
    if not text:
        return measure(where, None)
    spec = parse_link(text)
    if where.mode != "local":
        raise BenchError("--link starts its own vaults on the link's far side: it goes without --vaults")
    with link_emulator(spec) as link:
        shaped = dataclasses.replace(where, host=link.vault_host, launch_prefix=link.vault_prefix)
        with link.engine_side():
            return measure(shaped, spec)


def link_has_round_trip(text: str) -> bool:
    """Whether ``--link`` asks for a round trip (which only the modes that wait it can honour)."""
    return parse_link(text).rtt_s > 0


def prefill_model(tps: float | None, at: int | None) -> PrefillModel | None:
    """``--prefill-tps`` (and the length ``--prefill-at`` it was measured at), when given."""
    if tps is None:
        return None
    try:
        return PrefillModel.from_rate(tps, at)
    except ValueError as exc:
        raise BenchError(f"--prefill-tps: {exc}") from exc


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
    elif callable(render := getattr(result, "render", None)):
        render(console)  # results that render themselves (bench mlx)
    else:
        raise TypeError(f"no renderer for {type(result).__name__}")


__all__ = [
    "BenchResult",
    "link_has_round_trip",
    "model_shape",
    "on_link",
    "parse_codecs",
    "parse_lengths",
    "prefill_model",
    "render_result",
    "vault_settings",
]
