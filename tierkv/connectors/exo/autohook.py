"""The import hook ``tierkv exo install`` puts in EXO's environment (a ``.pth`` line imports this module).

It registers a ``sys.meta_path`` finder that, when ``exo.worker.engines.mlx.cache`` is imported (in
EXO's spawned runner processes as anywhere else), lets EXO's module load unchanged and then replaces
its ``KVPrefixCache`` with the tiered subclass — only if :mod:`~tierkv.connectors.exo.guard` passes,
else it says why on stderr and leaves EXO untouched. EXO's files are never edited; ``MlxBuilder``
imports ``KVPrefixCache`` from that module after it loaded, so it builds the tiered one.
``TIERKV_EXO=off`` in the environment turns the hook off without uninstalling it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from tierkv.connectors.exo.guard import EXO_MODULE, GuardError, check, exo_version

log = logging.getLogger(__name__)


def patch(module: ModuleType) -> bool:
    """Swap ``module.KVPrefixCache`` for the tiered subclass if the guard passes; True when swapped."""
    if getattr(module, "__tierkv_original__", None) is not None:
        return True
    try:
        check(module, exo_version())
    except GuardError as exc:
        log.warning("%s", exc)
        return False
    from tierkv.connectors.exo.adapter import tiered_prefix_cache

    module.__tierkv_original__ = module.KVPrefixCache  # type: ignore[attr-defined]
    module.KVPrefixCache = tiered_prefix_cache(module)  # type: ignore[attr-defined]
    log.info("tierkv EXO adapter active in %s", module.__name__)
    return True


class _PatchingLoader(importlib.abc.Loader):
    """Runs EXO's own loader, then :func:`patch`."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        patch(module)


class ExoFinder(importlib.abc.MetaPathFinder):
    """Finds EXO's cache module through the other finders and wraps its loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != EXO_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Register the finder once (the ``.pth`` line's call); patches a module already imported too."""
    if os.environ.get("TIERKV_EXO", "").lower() in ("0", "off", "false", "no"):
        return
    if not any(isinstance(f, ExoFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ExoFinder())
    if EXO_MODULE in sys.modules:
        patch(sys.modules[EXO_MODULE])


__all__ = ["ExoFinder", "install", "patch"]
