"""``tierkv exo install / uninstall / status``: one ``.pth`` file in EXO's site-packages, nothing else.

The file holds one line that imports :mod:`tierkv.connectors.exo.autohook` (when tierkv is importable
there) and calls its ``install``. Uninstall removes the file only when it still holds exactly that line,
so it never removes what someone else wrote.

Often run as root against a site directory others can write to, so nothing is taken on trust: the target
interpreter's answer must name an existing directory, and the file is written without following links (a
temporary file in that directory, then an atomic rename over the name; a symbolic link in its place,
dangling or not, is refused). Every refusal is one :class:`InstallError` line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
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
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise InstallError(f"{python} did not answer the probe: {done.stderr.strip()[-500:]}") from exc
    if not isinstance(result, dict):
        raise InstallError(f"{python} answered the probe with {type(result).__name__}, not an object")
    return result


def _ours(pth: Path) -> bool:
    """Whether ``pth`` is the file :func:`install` writes (a link never is)."""
    if pth.is_symlink() or not pth.is_file():
        return False
    try:
        return pth.read_text() == PTH_LINE
    except (OSError, UnicodeDecodeError):
        return False


def _interpreter(python: str | None) -> str:
    if python is None:
        return sys.executable
    if not python.strip():
        raise InstallError("--python is empty: name EXO's interpreter, or leave the option out for this one")
    return python


def _site(exe: str, site_dir: str | None, info: dict[str, object]) -> Path:
    """The directory to write into: ``site_dir``, else the interpreter's ``purelib``, checked."""
    where = site_dir if site_dir is not None else info.get("purelib")
    if not isinstance(where, str) or not where:
        raise InstallError(f"{exe} answered no site-packages directory (purelib: {where!r})")
    site = Path(where)
    if not site.is_dir():
        raise InstallError(f"the site-packages directory {site} of {exe} is not an existing directory")
    return site


def _target(python: str | None, site_dir: str | None) -> tuple[str, Path, dict[str, object]]:
    exe = _interpreter(python)
    info = probe(exe, site_dir)
    return exe, _site(exe, site_dir, info), info


def _write(pth: Path) -> None:
    """``PTH_LINE`` into ``pth`` without following a link: a temporary file beside it, renamed over it."""
    if pth.is_symlink():
        raise InstallError(f"{pth} is a symbolic link (to {os.readlink(pth)}); not writing through it")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tierkv-exo-", suffix=".tmp", dir=pth.parent)
    except OSError as exc:
        raise InstallError(f"cannot write into {pth.parent}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w") as out:
            out.write(PTH_LINE)
        os.chmod(tmp, 0o644)  # every user of that interpreter reads it
        os.replace(tmp, pth)  # a rename replaces whatever holds the name; it follows no link
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise InstallError(f"cannot write {pth}: {exc.strerror or exc}") from None


def install(python: str | None = None, site_dir: str | None = None) -> Path:
    """Write the ``.pth`` file into ``python``'s site-packages (or ``site_dir``); returns its path."""
    exe, site, info = _target(python, site_dir)
    if info.get("tierkv"):
        raise InstallError(
            f"tierkv is not importable by {exe} ({info['tierkv']}); pip install tierkv[mlx] there"
        )
    pth = site / PTH_NAME
    if pth.exists() and not pth.is_symlink() and not _ours(pth):
        raise InstallError(f"{pth} exists and was not written by tierkv; not overwriting it")
    _write(pth)
    return pth


def uninstall(python: str | None = None, site_dir: str | None = None) -> Path | None:
    """Remove the ``.pth`` file install wrote; None when there was none."""
    exe = _interpreter(python)
    site = _site(exe, site_dir, {} if site_dir is not None else probe(exe))
    pth = site / PTH_NAME
    if pth.is_symlink():
        raise InstallError(f"{pth} is a symbolic link, not the file tierkv writes; not removing it")
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
