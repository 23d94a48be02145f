"""Prefill vs hot hit vs cold restore time to first token, per prompt length: the result of an engine
bench that measures in-process (``tierkv bench mlx``, ``tierkv bench llamacpp``), its table, verdict and
JSON.

Each :class:`TTFTRow` is one prompt: the three TTFTs, what the cold restore moved, how its time splits
(``parts``, seconds by name, e.g. network / load / compute), and whether it computed what the engine
computes from memory (``identical``: the engine's check). Medians per length are reported; nothing
is asserted about timings.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass
class TTFTRow:
    tokens: int
    prefill_s: float
    hot_s: float
    cold_s: float
    restored: int
    fetched_bytes: int
    parts: dict[str, float]
    identical: bool


@dataclass
class TTFTResult:
    mode: str
    settings: dict[str, Any]
    model_desc: str
    parts: tuple[str, ...]
    """Names of the shares a cold restore's time is split into, in table order."""
    check: str
    """What a cold restore must give for its row to be ``identical`` (for the verdict)."""
    rows: list[TTFTRow] = field(default_factory=list)
    vaults: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    verdict: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.identical for r in self.rows)

    def finish(self) -> None:
        """Set the one-line verdict once every row is in."""
        if not self.ok:
            self.verdict = (
                "FAIL: a cold restore did not give the hot hit's logits and the prefill's first token"
            )
            return
        longest = max(r.tokens for r in self.rows)
        at = [r for r in self.rows if r.tokens == longest]
        speedup = statistics.median(r.prefill_s for r in at) / statistics.median(r.cold_s for r in at)
        self.verdict = f"cold restore {speedup:.1f}x faster than prefill at {longest} tokens (median)"

    def document(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "settings": self.settings,
            "model": self.model_desc,
            "rows": [asdict(r) for r in self.rows],
            "vaults": self.vaults,
            "warnings": self.warnings,
            "ok": self.ok,
            "verdict": self.verdict,
        }

    def render(self, console: Console) -> None:
        table = Table(title=f"tierkv bench {self.mode} — {self.model_desc}")
        for name in (
            "tokens",
            "prefill ms",
            "hot ms",
            "cold ms",
            "prefill/cold",
            "MB moved",
            "/".join(self.parts),
        ):
            table.add_column(name, justify="right")
        for length in sorted({r.tokens for r in self.rows}):
            rows = [r for r in self.rows if r.tokens == length]
            prefill, hot, cold = (
                statistics.median(getattr(r, k) for r in rows) for k in ("prefill_s", "hot_s", "cold_s")
            )
            shares = "/".join(f"{statistics.median(r.parts[p] for r in rows) / cold:.0%}" for p in self.parts)
            moved = statistics.median(r.fetched_bytes for r in rows) / 1e6
            table.add_row(
                str(length), f"{prefill * 1e3:.1f}", f"{hot * 1e3:.1f}", f"{cold * 1e3:.1f}",
                f"{prefill / cold:.1f}x", f"{moved:.2f}", shares,
            )  # fmt: skip
        console.print(table)
        for w in self.warnings:
            console.print(f"[yellow]warning:[/yellow] {w}")
        console.print(self.verdict)


__all__ = ["TTFTResult", "TTFTRow"]
