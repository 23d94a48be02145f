"""``tierkv exo install / uninstall / status``: one ``.pth`` file in EXO's site-packages, nothing else.

The file holds one line that imports :mod:`tierkv.connectors.exo.autohook` (when tierkv is importable
there) and calls its ``install``. Uninstall removes the file only when it still holds exactly that line,
so it never removes what someone else wrote.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tierkv.errors import TierKVError

log = logging.getLogger(__name__)

PTH_NAME: Final = "tierkv-exo.pth"
PTH_LINE: Final = (
    "import importlib.util as _t; _t.find_spec('tierkv') and "
    "__import__('tierkv.connectors.exo.autohook', fromlist=['install']).install()\n"
)

_PROBE: Final = """
import json, sys, sysconfig
out = {"purelib": sysconfig.get_paths()["purelib"], "python": sys.executable}
try:
    import tierkv.connectors.exo.guard as g
except ImportError as exc:
    out["tierkv"] = repr(exc)
else:
    out["tierkv"] = ""
    try:
        import importlib
        module = importlib.import_module(g.EXO_MODULE)
    except Exception as exc:
        out["exo"] = repr(exc)
    else:
        out["exo"] = ""
        out["version"] = g.exo_version()
        out["problems"] = g.problems(module, out["version"])
        out["active"] = getattr(module, "__tierkv_original__", None) is not None
print(json.dumps(out))
"""


class InstallError(TierKVError):
    """The target environment cannot take the hook (no tierkv there, a foreign file in the way)."""


@dataclass(frozen=True)
class Status:
    """What ``tierkv exo status`` reports about one environment."""

    python: str
    site_dir: str
    installed: bool
    tierkv_error: str
    exo_error: str
    version: str | None
    problems: tuple[str, ...]
    active: bool

    def lines(self) -> list[str]:
        pth = Path(self.site_dir) / PTH_NAME
        out = [
            f"python: {self.python}",
            f"hook: {'installed' if self.installed else 'not installed'} ({pth})",
        ]
        if self.tierkv_error:
            return [*out, f"tierkv: not importable there ({self.tierkv_error})"]
        if self.exo_error:
            return [*out, f"exo: cannot import the cache module ({self.exo_error})"]
        guard = "passes" if not self.problems else "refuses: " + "; ".join(self.problems)
        return [*out, f"exo: version {self.version}", f"guard: {guard}", f"adapter active: {self.active}"]


def probe(python: str, site_dir: str | None = None) -> dict[str, object]:
    """Run the probe in ``python`` (with ``site_dir`` added as a site directory when given)."""
    prefix = f"import site; site.addsitedir({site_dir!r})\n" if site_dir else ""
    try:
        done = subprocess.run(
            [python, "-c", prefix + _PROBE], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"cannot run {python}: {exc}") from exc
    try:
        result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise InstallError(f"{python} did not answer the probe: {done.stderr.strip()[-500:]}") from exc
    return result


def _ours(pth: Path) -> bool:
    """Whether ``pth`` is the file :func:`install` writes."""
    return pth.is_file() and pth.read_text() == PTH_LINE


def _target(python: str | None, site_dir: str | None) -> tuple[str, Path, dict[str, object]]:
    exe = python or sys.executable
    info = probe(exe, site_dir)
    return exe, Path(site_dir or str(info["purelib"])), info


def install(python: str | None = None, site_dir: str | None = None) -> Path:
    """Write the ``.pth`` file into ``python``'s site-packages (or ``site_dir``); returns its path."""
    exe, site, info = _target(python, site_dir)
    if info.get("tierkv"):
        raise InstallError(
            f"tierkv is not importable by {exe} ({info['tierkv']}); pip install tierkv[mlx] there"
        )
    pth = site / PTH_NAME
    if pth.exists() and not _ours(pth):
        raise InstallError(f"{pth} exists and was not written by tierkv; not overwriting it")
    pth.write_text(PTH_LINE)
    return pth


def uninstall(python: str | None = None, site_dir: str | None = None) -> Path | None:
    """Remove the ``.pth`` file install wrote; None when there was none."""
    site = Path(site_dir) if site_dir else Path(str(probe(python or sys.executable)["purelib"]))
    pth = site / PTH_NAME
    if not pth.exists():
        return None
    if not _ours(pth):
        raise InstallError(f"{pth} was not written by tierkv (its content differs); not removing it")
    pth.unlink()
    return pth


def status(python: str | None = None, site_dir: str | None = None) -> Status:
    """Whether the hook is installed, and whether the guard passes for the EXO that environment has."""
    exe, site, info = _target(python, site_dir)
    problems = info.get("problems") or []
    version = info.get("version")
    return Status(
        python=exe,
        site_dir=str(site),
        installed=_ours(site / PTH_NAME),
        tierkv_error=str(info.get("tierkv") or ""),
        exo_error=str(info.get("exo") or ""),
        version=str(version) if version is not None else None,
        problems=tuple(str(p) for p in problems) if isinstance(problems, list) else (),
        active=bool(info.get("active")),
    )


__all__ = ["PTH_LINE", "PTH_NAME", "InstallError", "Status", "install", "probe", "status", "uninstall"]
