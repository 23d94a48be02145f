"""The check the EXO adapter activates behind: EXO's version and every signature and attribute it uses.

The adapter subclasses EXO's ``KVPrefixCache`` and reads its private lists, so an EXO release that
renames one of them must leave EXO untouched rather than half-patched. Checked against EXO's
``src/exo/worker/engines/mlx/cache.py`` (version 0.3.68).
"""

from __future__ import annotations

import inspect
import logging
from importlib import metadata
from types import ModuleType
from typing import Final

from tierkv.errors import TierKVError

log = logging.getLogger(__name__)

EXO_MODULE: Final = "exo.worker.engines.mlx.cache"
SUPPORTED_VERSIONS: Final = ("0.3.",)
"""Version prefixes of the ``exo`` distribution the adapter was written against."""

METHODS: Final = {
    "__init__": ("self", "group"),
    "add_kv_cache": ("self", "prompt_tokens", "cache", "ssm_snapshots", "media_regions", "prefill_tps"),
    "get_kv_cache": ("self", "model", "prompt_tokens", "media_regions"),
    "_evict_if_needed": ("self",),
}
"""``KVPrefixCache`` methods the adapter overrides or calls, with their parameter names in order."""

ATTRIBUTES: Final = ("prompts", "caches", "_snapshots", "_last_used", "prefill_tps")
"""Lists a fresh ``KVPrefixCache(None)`` must have (the adapter diffs them around an eviction)."""

MODULE_NAMES: Final = ("KVPrefixCache", "snapshot_ssm_states", "has_non_kv_caches")


class GuardError(TierKVError):
    """The installed EXO is not the one the adapter was written against; EXO is left untouched."""


def exo_version() -> str | None:
    """The installed ``exo`` distribution's version (None when it has no metadata)."""
    try:
        return metadata.version("exo")
    except metadata.PackageNotFoundError:
        return None


def problems(module: ModuleType, version: str | None) -> list[str]:
    """Every mismatch between ``module`` (EXO's cache module) and what the adapter relies on."""
    found: list[str] = []
    if version is None or not version.startswith(SUPPORTED_VERSIONS):
        found.append(
            f"exo version {version!r} is not supported (supported: {', '.join(SUPPORTED_VERSIONS)}*)"
        )
    missing = [n for n in MODULE_NAMES if not hasattr(module, n)]
    if missing:
        return [*found, f"{module.__name__} lacks {', '.join(missing)}"]
    cls = getattr(module, "__tierkv_original__", module.KVPrefixCache)
    found += _signature_problems(cls)
    if not found:
        found += _attribute_problems(cls)
    return found


def _signature_problems(cls: type) -> list[str]:
    found = []
    for name, expected in METHODS.items():
        method = getattr(cls, name, None)
        if not callable(method):
            found.append(f"KVPrefixCache.{name} is missing")
            continue
        try:
            params = tuple(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            params = ()
        if params != expected:
            found.append(f"KVPrefixCache.{name}{params} differs from the expected {expected}")
    return found


def _attribute_problems(cls: type) -> list[str]:
    try:
        probe = cls(None)
    except Exception as exc:  # any failure means the constructor changed
        return [f"KVPrefixCache(None) failed: {exc!r}"]
    return [
        f"KVPrefixCache has no list attribute {a!r}"
        for a in ATTRIBUTES
        if not isinstance(getattr(probe, a, None), list)
    ]


def check(module: ModuleType, version: str | None) -> None:
    """Raise :class:`GuardError` naming every mismatch (``version``: :func:`exo_version`)."""
    found = problems(module, version)
    if found:
        raise GuardError("tierkv EXO adapter not activated: " + "; ".join(found))


__all__ = ["ATTRIBUTES", "EXO_MODULE", "METHODS", "GuardError", "check", "exo_version", "problems"]
