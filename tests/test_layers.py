"""The import contract: which part of tierkv may import which, checked over every module's syntax tree.

Arrows point down only. Each unit (a top-level module or subpackage of ``tierkv``) lists the units it may
import; anything else — an upward or sideways arrow, also one dodged inside a function or under
``TYPE_CHECKING`` — fails here and so fails ``make lint``. ``from tierkv import __version__`` is the one
name any unit may take from the package root (the root re-exports the client lazily, so anything else
from it would be an arrow to the client).

A new unit must be added to :data:`ALLOWED` before it can be imported at all: the contract is a whitelist.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "tierkv"
GENERATED = ROOT / "wire" / "_proto"

_BASE = frozenset({"errors", "limits", "endpoints", "roles", "logs", "extras", "_malloc", "records", "certs"})
_SHARED = _BASE | {"retention", "config", "keys", "codec"}
_APPS = {"bench", "demo", "routing", "admin", "status", "warm"}
_EVERYTHING_BELOW_APPS = _SHARED | {"wire", "client", "vault", "tiering", "connectors"}

ALLOWED: dict[str, frozenset[str]] = {
    # the foundation: no tierkv imports but the error hierarchy
    **{name: frozenset({"errors"}) for name in _BASE},
    "retention": _BASE,
    "config": _BASE | {"retention"},
    "keys": _BASE,
    "codec": _BASE,
    # the bulk framing and the generated protobuf code both sides speak
    "wire": _BASE | {"codec", "retention"},
    # the daemon and the client meet only on the wire
    "vault": _SHARED | {"wire"},
    "client": _SHARED | {"wire"},
    # the engine-agnostic pipeline reaches vaults through its Storage seam (open_cluster builds a Cluster)
    "tiering": _SHARED | {"client"},
    "connectors": _SHARED | {"tiering"},
    # operator tools over the client
    "status": _SHARED | {"client"},
    "admin": _SHARED | {"client", "status"},
    "warm": _SHARED | {"client"},
    # applications: they start vaults, engines with a hook, and measure
    "routing": _EVERYTHING_BELOW_APPS,
    "bench": _EVERYTHING_BELOW_APPS | {"status", "console"},
    "demo": _EVERYTHING_BELOW_APPS | {"bench", "status"},
    # the commands
    "console": _BASE | {"config"},
    "cli": frozenset(_EVERYTHING_BELOW_APPS | _APPS | {"console"}),
    "__main__": frozenset({"cli"}),
    "": frozenset({"client"}),  # the package root re-exports the client lazily
}

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("tierkv.connectors.vllm.smoke_test", "client"): (
        "a command-line diagnostic outside the serving path: it asks each vault for health and stats, "
        "which the pipeline's Storage does not expose"
    ),
}
"""(module, unit) arrows allowed although the module's unit may not import that unit, each with why."""


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    """``tierkv.vault.store`` → ``vault``; the package root is ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _targets(node: ast.AST, module: str, is_package: bool, root: Path = ROOT) -> list[str]:
    """The tierkv modules one import statement names (``from tierkv import x`` names ``tierkv.x`` when
    ``x`` is a module, else the root)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "tierkv"]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        name = ".".join([*base, *([node.module] if node.module else [])])
    else:
        name = node.module or ""
    if name.split(".")[0] != "tierkv":
        return []
    if name != "tierkv":
        return [name]
    out = []
    for alias in node.names:
        sub = root / alias.name
        if sub.is_dir() or sub.with_suffix(".py").exists():
            out.append(f"tierkv.{alias.name}")
        elif alias.name != "__version__":
            out.append("tierkv")
    return out


def violations(root: Path = ROOT) -> list[str]:
    """Every import that breaks the contract, as ``file:line: module -> target (unit -> unit)``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        module = _module_name(path, root)
        unit = _unit(module)
        allowed = ALLOWED.get(unit)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, module, path.name == "__init__.py", root):
                to = _unit(target)
                if to == unit or (module, to) in EXCEPTIONS:
                    continue
                if allowed is None or to not in allowed:
                    where = path.relative_to(root.parent)
                    found.append(f"{where}:{node.lineno}: {module} -> {target} ({unit or 'tierkv'} -> {to})")
    return found


def test_every_import_follows_the_layers() -> None:
    found = violations()
    assert not found, (
        "imports against the layers (tests/test_layers.py says which are allowed):\n" + "\n".join(found)
    )


def test_every_unit_is_in_the_contract() -> None:
    units = {_unit(_module_name(p)) for p in ROOT.rglob("*.py") if GENERATED not in p.parents}
    assert units <= set(ALLOWED), f"units the contract does not know: {sorted(units - set(ALLOWED))}"


def test_every_exception_is_still_needed() -> None:
    """An exception whose arrow is gone is deleted, so the list only ever shrinks to what is true."""
    used = set()
    for path in ROOT.rglob("*.py"):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            used |= {(module, _unit(t)) for t in _targets(node, module, path.name == "__init__.py")}
    assert set(EXCEPTIONS) <= used, f"stale exceptions: {sorted(set(EXCEPTIONS) - used)}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "from tierkv.connectors.hf import x\n",
            "tierkv.connectors.hf (codec -> connectors)",
        ),
        (
            "def f():\n    import tierkv.vault.store\n",
            "tierkv.vault.store (codec -> vault)",
        ),
        ("from tierkv import admin\n", "tierkv.admin (codec -> admin)"),
        ("from tierkv import VaultClient\n", "tierkv (codec -> )"),
        ("from ..client import x\n", "tierkv.client (codec -> client)"),
    ],
)
def test_an_upward_or_sideways_arrow_fails(tmp_path: Path, source: str, expected: str) -> None:
    pkg = tmp_path / "tierkv"
    (pkg / "codec").mkdir(parents=True)
    for sub in ("connectors", "vault", "admin.py", "client"):
        (pkg / sub).mkdir() if not sub.endswith(".py") else (pkg / sub).write_text("")
    (pkg / "codec" / "bad.py").write_text(source)
    (pkg / "codec" / "fine.py").write_text("from tierkv.errors import X\nfrom tierkv import __version__\n")
    found = violations(pkg)
    assert [f.split(": ", 1)[1] for f in found] == [f"tierkv.codec.bad -> {expected}"]
