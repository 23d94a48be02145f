"""What every bench mode shares, written once: the result record, the time budget, the progress bar and
the checks on settings.

Each mode (:mod:`.synthetic`, :mod:`.hf`, :mod:`.engine`) measures differently, but a run always has the
same outer life: settings are checked before anything starts, a time budget may cut the sweep short
(the run then says so), a transient progress bar shows where it is, and the result carries warnings,
errors and a one-line verdict next to its figures in the ``--json`` document.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from tierkv.bench.breakeven import BreakEven
from tierkv.bench.record import RunMeta
from tierkv.codec import CODECS
from tierkv.errors import BenchError

logger = logging.getLogger(__name__)


class Sweep(Protocol):
    """What the settings of every mode have: prompt lengths, repeats per length, a time budget."""

    @property
    def lengths(self) -> tuple[int, ...]: ...

    @property
    def repeats(self) -> int: ...

    @property
    def max_seconds(self) -> float: ...


def check_sweep(
    sweep: Sweep,
    *,
    min_length: int = 1,
    what: str = "one token",
    positive: Mapping[str, float] | None = None,
) -> None:
    """The checks every sweep over prompt lengths needs, before anything starts.

    ``positive`` names (as the user typed them) the mode's own settings that must be above zero;
    every prompt length must be at least ``min_length`` tokens, ``what`` says why ("one block").
    """
    values = {"--repeats": sweep.repeats, "--max-seconds": sweep.max_seconds, **(positive or {})}
    bad = [name for name, value in values.items() if not value > 0]
    if bad:
        raise BenchError(f"{', '.join(bad)} must be positive")
    found = list(sweep.lengths)
    if not found or min(found) < min_length:
        raise BenchError(f"every prompt length must be at least {what} ({min_length} tokens), got {found}")


def settings_document(settings: Any, *, drop: Iterable[str] = ()) -> dict[str, Any]:
    """A settings dataclass as JSON-ready values: nested dataclasses as dicts, tuples as lists."""
    fields = dataclasses.asdict(settings)
    for name in drop:
        del fields[name]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}


def check_codecs(codecs: Iterable[str]) -> None:
    names = list(codecs)
    unknown = [c for c in names if c not in CODECS]
    if unknown or not names:
        raise BenchError(f"unknown codec {unknown or names}; expected some of {sorted(CODECS)}")


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` when both were measured (and ``b`` is not zero)."""
    return a / b if a is not None and b else None


@dataclasses.dataclass
class Deadline:
    """The ``--max-seconds`` budget of a run, counted from its start."""

    max_seconds: float
    started: float = dataclasses.field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def passed(self) -> bool:
        return self.elapsed() > self.max_seconds

    def note(self) -> str:
        return f"stopped at --max-seconds {self.max_seconds:g}"


@dataclasses.dataclass
class BenchRun:
    """The part of every mode's result that is not a figure: context, break-even, problems, verdict.

    Subclasses add their settings and rows, override :meth:`figures_document` for their part of the
    ``--json`` document, and :attr:`ok` when a run needs more than "no errors" to count.
    """

    meta: RunMeta
    breakeven: dict[str, BreakEven] = dataclasses.field(default_factory=dict, kw_only=True)
    truncated: bool = dataclasses.field(default=False, kw_only=True)
    warnings: list[str] = dataclasses.field(default_factory=list, kw_only=True)
    errors: list[str] = dataclasses.field(default_factory=list, kw_only=True)
    verdict: str = dataclasses.field(default="", kw_only=True)

    @property
    def ok(self) -> bool:
        return not self.errors

    def figures_document(self) -> dict[str, Any]:
        return {}

    def document(self) -> dict[str, Any]:
        return {
            **self.meta.as_dict(),
            "ok": self.ok,
            "verdict": self.verdict,
            "warnings": self.warnings,
            "errors": self.errors,
            "truncated": self.truncated,
            **self.figures_document(),
            "breakeven": {k: b.as_dict() for k, b in self.breakeven.items()},
        }

    def out_of_time(self, deadline: Deadline) -> bool:
        """True, and the run marked truncated, once the time budget is spent."""
        if deadline.passed():
            self.truncated = True
        return self.truncated

    def failure(self, fallback: str) -> str:
        """The verdict of a failed run: its first error, or ``fallback`` when nothing was measured."""
        return "FAIL: " + (self.errors[0] if self.errors else fallback)

    def check_speedup(self, tokens: int, speedup: float | None, floor: float | None) -> None:
        """``--min-speedup``: a restore not that much faster than recomputing fails the run."""
        if floor is not None and (speedup or 0.0) < floor:
            self.errors.append(
                f"{tokens:,} tokens: speedup {speedup or 0.0:.2f}× is below --min-speedup {floor:g}"
            )

    def finish(self, deadline: Deadline) -> None:
        self.meta.finish(deadline.elapsed())


class Bar:
    """A progress bar's one task: what is running now, and how far along."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task

    def label(self, text: str) -> None:
        self._progress.update(self._task, description=text)

    def advance(self, steps: float = 1) -> None:
        self._progress.advance(self._task, steps)


@contextlib.contextmanager
def progress_bar(console: Console, total: int, *, percent: bool = False) -> Iterator[Bar]:
    """A transient bar (gone once the run ends, so the tables stand alone), counting steps or percent."""
    counter = TaskProgressColumn() if percent else MofNCompleteColumn()
    columns = (TextColumn("{task.description}"), BarColumn(), counter, TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        yield Bar(progress, progress.add_task("", total=total))


__all__ = [
    "Bar",
    "BenchRun",
    "Deadline",
    "Sweep",
    "check_codecs",
    "check_sweep",
    "progress_bar",
    "ratio",
    "settings_document",
]
