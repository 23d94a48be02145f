"""Logging setup for the command line: quiet by default, ``-v`` for info, ``-vv`` for debug.

Library modules only ever call ``logging.getLogger(__name__)``; only the CLI configures handlers. Logs go
to stderr, or to ``[log] file`` when it is set (tierkv 0.1's ``log_file``), appended.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from tierkv.errors import ConfigError

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class Throttle:
    """Counts events by kind and lets a log line about them through at most once per ``interval_s``: the
    first event's line goes out at once, the later ones' are summed into the next line that is due."""

    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._since = clock()
        self._last = float("-inf")

    def add(self, counts: Mapping[str, int]) -> tuple[Counter[str], float] | None:
        """Count ``counts``; when a line is due, the counts since the last line and the seconds they
        span (and start afresh), else None."""
        now = self._clock()
        with self._lock:
            self._counts.update({k: n for k, n in counts.items() if n})
            if not self._counts or now - self._last < self.interval_s:
                return None
            due, span = self._counts, now - self._since
            self._counts, self._since, self._last = Counter(), now, now
        return due, span


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
