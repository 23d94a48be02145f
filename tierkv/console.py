"""What every command shares: the two consoles, the one-line failure and loading the config.

The ``tierkv`` command and its ``bench`` sub-commands both print through these, so a bad config reads
the same everywhere: one red line naming the file, the key and the problem, exit 2, never a traceback.
The consoles (and rich) are made on first use: ``tierkv vault`` starts without printing through them,
and the test suite starts it some three hundred times.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, NoReturn

import typer

from tierkv.config import Config, load_config
from tierkv.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console


@functools.cache
def out() -> Console:
    """The console for results (stdout)."""
    return _console(stderr=False)


@functools.cache
def err() -> Console:
    """The console for errors and progress (stderr)."""
    return _console(stderr=True)


def _console(stderr: bool) -> Console:
    from rich.console import Console

    # rich assumes 80 columns when output is piped; tables of figures read better unwrapped
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def escape(text: str) -> str:
    """``text`` with rich markup escaped, so a path or message with brackets prints as it is."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def fail(exc: Exception, label: str = "error", code: int = 2) -> NoReturn:
    """One red line on stderr and the exit code; never a traceback."""
    err().print(f"[red]{label}:[/red] {escape(str(exc))}", soft_wrap=True)
    raise typer.Exit(code) from exc


def load(path: str | None) -> Config:
    """The config at ``path`` (or where it is looked for), or exit 2 with the one line that says why."""
    try:
        return load_config(path)
    except ConfigError as exc:
        fail(exc, "config error")


__all__ = ["err", "escape", "fail", "load", "out"]
