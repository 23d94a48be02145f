"""Logging setup for the command line: quiet by default, ``-v`` for info, ``-vv`` for debug.

Library modules only ever call ``logging.getLogger(__name__)``; only the CLI configures handlers. Logs go
to stderr, or to ``[log] file`` when it is set (tierkv 0.1's ``log_file``), appended.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from tierkv.errors import ConfigError

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (and exc when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(
    verbosity: int = 0,
    *,
    level: str = "warning",
    json_lines: bool = False,
    file: str = "",
    source: str = "config",
) -> None:
    """Configure the root logger once: the config's level, lowered by each ``-v``; ``source`` names the
    config in the error when ``file`` cannot be opened."""
    base = _LEVELS.get(level, logging.WARNING)
    effective = max(logging.DEBUG, base - 10 * verbosity)
    handler = _file_handler(file, source) if file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JSONFormatter()
        if json_lines
        else logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(effective)
    logging.getLogger("grpc").setLevel(max(effective, logging.WARNING))


def console_shows(level: int = logging.INFO) -> bool:
    """Whether the root logger writes records of ``level`` to the terminal (stderr or stdout), so a line
    also logged there need not be printed again."""
    root = logging.getLogger()
    if not root.isEnabledFor(level):
        return False
    return any(
        isinstance(h, logging.StreamHandler)
        and not isinstance(h, logging.FileHandler)
        and getattr(h, "stream", None) in (sys.stderr, sys.stdout)
        and h.level <= level
        for h in root.handlers
    )


def _file_handler(file: str, source: str) -> logging.Handler:
    path = Path(file).expanduser()
    try:
        return logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, "log.file", f"cannot open {path}: {exc.strerror or exc}") from exc
