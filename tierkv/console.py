"""What every command shares: the two consoles, the one-line failure and loading the config.

The ``tierkv`` command and its ``bench`` sub-commands both print through these, so a bad config reads
the same everywhere: one red line naming the file, the key and the problem, exit 2, never a traceback.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from tierkv.config import Config, load_config
from tierkv.errors import ConfigError

# rich assumes 80 columns when output is piped; tables of figures read better unwrapped
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def fail(exc: Exception, label: str = "error", code: int = 2) -> NoReturn:
    """One red line on stderr and the exit code; never a traceback."""
    err.print(f"[red]{label}:[/red] {escape(str(exc))}", soft_wrap=True)
    raise typer.Exit(code) from exc


def load(path: str | None) -> Config:
    """The config at ``path`` (or where it is looked for), or exit 2 with the one line that says why."""
    try:
        return load_config(path)
    except ConfigError as exc:
        fail(exc, "config error")


__all__ = ["err", "fail", "load", "out"]
