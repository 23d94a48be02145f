"""Checks of the settings an engine hook is given, so every hook refuses a bad value the same way.

Each raises :class:`~tierkv.errors.ConfigError` naming where the value came from (``source``) and which
setting it is (``key``), worded like the errors of :mod:`tierkv.config`, and returns the value.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from tierkv.errors import ConfigError

N = TypeVar("N", int, float)


def one_of(source: str, key: str, value: str, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices``."""
    allowed = tuple(choices)
    if value not in allowed:
        raise ConfigError(source, key, f"expected one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def at_least(source: str, key: str, value: N, minimum: N) -> N:
    """``value`` if it is ``minimum`` or more."""
    if value < minimum:
        raise ConfigError(source, key, f"expected at least {minimum}, got {value!r}")
    return value


__all__ = ["at_least", "one_of"]
