"""The engine pages (and the getting-started pages and the README, which give the same lines) name only
what exists: a reader wiring tierkv into an engine copies these names.

The pages' commands and snippets mostly need an engine (and often a GPU) to run, so here they are read,
not run: every ``tierkv`` command with its flags, every ``python -m`` module of this repository with
its flags, every ``tierkv.…`` import path and class, every ``make`` target and repository path, every
connector metric, and the settings tables, against the code, without importing an engine. The
getting-started pages are run as written in :mod:`tests.docs.test_getting_started`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from tierkv import cli
from tierkv.connectors.launcher_flags import launcher_parser
from tierkv.connectors.vault_settings import VaultSettings
from tierkv.connectors.vllm.settings import KNOWN_KEYS, ConnectorSettings
from tierkv.connectors.vllm.stats import COUNTERS

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [
        *(ROOT / "docs" / "engines").glob("*.md"),
        *(ROOT / "docs" / "getting-started").glob("*.md"),
        ROOT / "README.md",
    ]
)
NOT_CODE = ("tierkv.toml", "tierkv.layout")
"""``tierkv.…`` names that are not import paths: the config file, the prompt-layout hint's action type."""
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"(?<![\w./-])tierkv(?:\.[A-Za-z_]\w*)+")
COMMAND = re.compile(r"(?<![\w./-])tierkv((?: +[^\s|;&#)`]+)+)")
MODULE = re.compile(r"python3? -m ((?:tierkv|benchmarks)(?:\.\w+)+)((?: +[^\s|;&#)`]+)*)")
MAKE = re.compile(r"(?<![\w-])make ([a-z][\w-]*)")
PATH = re.compile(r"(?<![\w~./-])((?:scripts|tests|benchmarks|tierkv)/[\w./-]*\w)")
METRIC = re.compile(r"tierkv_connector_[\w{},]+")
FROM_IMPORT = re.compile(r"from (tierkv[\w.]*) import \(?([\w, ]+)")
LAUNCHER_FLAG = re.compile(r"--tierkv-[\w-]+")


def code(text: str) -> Iterator[str]:
    """Every fenced block's lines and every inline code span of a page."""
    for block in FENCE.findall(text):
        yield from block.splitlines()
    yield from (" ".join(span.split()) for span in SPAN.findall(FENCE.sub("", text)))


def found(pattern: re.Pattern[str]) -> Iterator[tuple[str, re.Match[str]]]:
    for page in PAGES:
        for line in code(page.read_text()):
            for match in pattern.finditer(line):
                yield page.name, match


# -- import paths --------------------------------------------------------------------------------------


@functools.cache
def module_file(dotted: str) -> Path | None:
    path = ROOT.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defined(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module or class body binds (definitions, assignments, imports)."""
    names: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, ast.If):  # ``if TYPE_CHECKING:`` imports of names a module loads lazily
            names.update(defined(node.body))
    return names


def resolves(dotted: str) -> bool:
    """``dotted`` is a module of this repository, or a name (and a class member) one defines."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:cut]))
        if path is not None:
            return _member(path, parts[cut:])
    return False


def _member(path: Path, rest: list[str]) -> bool:
    if not rest:
        return True
    node = defined(ast.parse(path.read_text()).body).get(rest[0])
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tierkv"):
        return resolves(".".join([node.module, *rest]))
    if isinstance(node, ast.ClassDef) and len(rest) == 2:
        return rest[1] in defined(node.body)
    return node is not None and len(rest) == 1


def test_every_tierkv_import_path_and_class_exists() -> None:
    names = {m.group(0) for _, m in found(DOTTED) if not m.group(0).startswith(NOT_CODE)}
    names |= {f"{m.group(1)}.{n.strip()}" for _, m in found(FROM_IMPORT) for n in m.group(2).split(",")}
    assert "tierkv.connectors.vllm.connector" in names and "tierkv.connectors.sglang.TierKVStorage" in names
    missing = sorted(n for n in names if not resolves(n))
    assert not missing, f"the engine pages name import paths that do not exist: {missing}"


def test_the_import_path_check_can_fail() -> None:
    assert resolves("tierkv.connectors.hf.TieredSession")
    assert resolves("tierkv.tiering.checks.SessionSettings")
    assert not resolves("tierkv.connectors.hf.TieredSesion")
    assert not resolves("tierkv.connector.hf")


# -- commands ------------------------------------------------------------------------------------------


def launcher_flags() -> set[str]:
    return {o for a in launcher_parser(codec=True)._actions for o in a.option_strings}


def unknown_flags(args: str) -> list[str]:
    """The flags of ``tierkv ARGS`` that the command line does not take (``[ ]`` and values ignored)."""
    command: Any = typer.main.get_command(cli.app)  # typer's own copy of click's classes
    wrong: list[str] = []
    for word in (w.strip("[]") for w in args.split()):
        flag = word.partition("=")[0]
        if word in getattr(command, "commands", {}):
            command = command.commands[word]
        elif flag.startswith("-") and flag not in {"-h", "--help"}:
            passthrough = command.context_settings.get("ignore_unknown_options", False)
            if passthrough and flag.startswith("--tierkv-"):
                wrong += [] if flag in launcher_flags() else [flag]
            elif not passthrough and flag not in {
                o for p in command.params for o in p.opts + p.secondary_opts
            }:
                wrong.append(flag)
    return wrong


def test_every_tierkv_command_and_flag_exists() -> None:
    bad = [
        f"{page}: tierkv{m.group(1)}: {flags}"
        for page, m in found(COMMAND)
        if (flags := unknown_flags(m.group(1)))
    ]
    assert not bad, bad


def test_every_launcher_flag_exists() -> None:
    """``--tierkv-*`` flags, wherever a page names them (tables included), are the launchers'."""
    named = {m.group(0) for _, m in found(LAUNCHER_FLAG)}
    assert "--tierkv-tenant" in named
    assert not named - launcher_flags(), sorted(named - launcher_flags())


def test_the_command_check_can_fail() -> None:
    assert unknown_flags("llama-serve --model m.gguf --n_ctx 8192 --tierkv-config t.toml") == []
    assert unknown_flags("mlx-serve --tierkv-codec int8 --prompt-cache-size 4") == []
    assert unknown_flags("bench llamacpp --tokens 512 --no-flash-attn") == []
    assert unknown_flags("bench llamacpp --tokenz 512") == ["--tokenz"]
    assert unknown_flags("llama-serve --tierkv-conf t.toml") == ["--tierkv-conf"]


def module_flags(module: str, args: str) -> list[str]:
    """Flags of ``python -m MODULE ARGS`` the module does not define (a launcher: its ``--tierkv-*`` ones)."""
    path = module_file(module)
    assert path is not None, f"no module {module}"
    source = path.read_text()
    flags = [w.strip("[]").partition("=")[0] for w in args.split() if w.strip("[]").startswith("--")]
    if "parse_launcher_args" in source:
        return [f for f in flags if f.startswith("--tierkv-") and f not in launcher_flags()]
    return [f for f in flags if f'"{f}"' not in source]


def test_every_python_module_and_flag_exists() -> None:
    runs = list(found(MODULE))
    assert any(m.group(1) == "tierkv.connectors.vllm.smoke_test" for _, m in runs)
    bad = [f"{page}: {m.group(0)}: {f}" for page, m in runs if (f := module_flags(m.group(1), m.group(2)))]
    assert not bad, bad


def test_every_make_target_and_repository_path_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = {m.group(1) for _, m in found(MAKE)}
    assert "test-vllm" in targets
    assert not [t for t in targets if not re.search(rf"(?m)^{re.escape(t)}:", makefile)]
    paths = {m.group(1) for _, m in found(PATH)}
    assert "tierkv/connectors/vllm/secondary.py" in paths
    assert not [p for p in paths if not (ROOT / p).exists()]


# -- metrics and settings ------------------------------------------------------------------------------


def expand(name: str) -> list[str]:
    """``a_{b,c}_d`` as ``a_b_d``, ``a_c_d``."""
    match = re.search(r"\{([^}]*)\}", name)
    if match is None:
        return [name]
    return [n for part in match.group(1).split(",") for n in expand(name.replace(match.group(0), part, 1))]


def test_every_connector_metric_a_page_names_exists() -> None:
    metrics = (ROOT / "tierkv" / "connectors" / "vllm" / "metrics.py").read_text()  # imports vLLM
    gauges = set(re.findall(r'(?m)^\w+_GAUGE = "(\w+)"', metrics))
    assert gauges
    exposed = {f"tierkv_connector_{c}_total" for c in COUNTERS} | gauges
    named = {n for _, m in found(METRIC) for n in expand(m.group(0).rstrip(","))}
    assert "tierkv_connector_evict_store_blocks_total" in named
    assert not named - exposed, sorted(named - exposed)


def test_the_vllm_page_names_every_connector_setting() -> None:
    page = (ROOT / "docs" / "engines" / "vllm.md").read_text()
    assert not [k for k in KNOWN_KEYS if f"`{k}`" not in page and f'"{k}"' not in page]


def secondary_tier_settings() -> list[str]:
    """The fields of the secondary tier's settings, read from its source (it imports vLLM)."""
    tree = ast.parse((ROOT / "tierkv" / "connectors" / "vllm" / "secondary.py").read_text())
    (settings,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TierSettings"]
    return [
        n.target.id
        for n in settings.body
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and "internal" not in ast.unparse(n)
    ]


def test_the_vllm_page_names_every_secondary_tier_setting() -> None:
    page = (ROOT / "docs" / "engines" / "vllm.md").read_text()
    section = page.split("## tierkv as a secondary tier")[1]
    keys = secondary_tier_settings()
    assert "store_threads" in keys
    assert not [k for k in keys if f"`{k}`" not in section and f'"{k}"' not in section]


@pytest.mark.parametrize("page", ["sglang.md"])
def test_the_settings_table_is_the_plugin_settings(page: str) -> None:
    """SGLang's ``tierkv`` table lists exactly the keys the backend accepts."""
    text = (ROOT / "docs" / "engines" / page).read_text()
    table = text.split("| key | default | meaning |")[1].split("\n\n")[0]
    listed = set(re.findall(r"(?m)^\| `(\w+)` \|", table))
    fields = {f.name for f in dataclasses.fields(VaultSettings) if not f.metadata.get("internal")}
    assert listed == fields, (sorted(listed - fields), sorted(fields - listed))


# -- launch lines --------------------------------------------------------------------------------------

SECONDARY_TIER_VLLM_KEYS = frozenset({"type", "module_path", "backpressure", "locality", "enable_kv_events"})
"""Keys of a ``secondary_tiers`` entry that vLLM's tier factory takes for itself or hands every tier."""


def launch_json(flag: str) -> list[tuple[str, dict[str, Any]]]:
    """The JSON after ``flag '`` in the pages' fenced blocks (a launch line spans several lines)."""
    out = []
    for page in PAGES:
        for block in FENCE.findall(page.read_text()):
            for raw in re.findall(rf"{re.escape(flag)} '([^']*)'", block):
                out.append((page.name, json.loads(raw)))  # a page's JSON that does not parse fails here
    return out


@pytest.fixture
def toml(tmp_path: Path) -> str:
    """A tierkv.toml that names a vault, for ``config_path`` (the pages point at /etc/tierkv)."""
    path = tmp_path / "tierkv.toml"
    path.write_text('[cluster.kv_cold]\nhost = "127.0.0.1"\nport = 50051\n')
    return str(path)


def test_every_vllm_launch_line_is_json_the_connector_and_tier_accept(toml: str) -> None:
    lines = launch_json("--kv-transfer-config")
    assert {c["kv_connector"] for _, c in lines} >= {"TierKVConnector", "OffloadingConnector"}
    for page, config in lines:
        extra = config.get("kv_connector_extra_config", {})
        if config["kv_connector"] == "TierKVConnector":
            assert resolves(f"{config['kv_connector_module_path']}.TierKVConnector"), page
            ConnectorSettings.from_extra({**extra, "config_path": toml})
        for tier in extra.get("secondary_tiers", []):
            assert resolves(f"{tier['module_path']}.{tier['type']}"), page
            unknown = set(tier) - SECONDARY_TIER_VLLM_KEYS - set(secondary_tier_settings())
            assert not unknown, (page, unknown)


def test_the_sglang_launch_line_is_json_the_backend_accepts(toml: str) -> None:
    lines = launch_json("--hicache-storage-backend-extra-config")
    assert [page for page, _ in lines] == ["README.md", "sglang.md"]
    for page, extra in lines:
        assert resolves(f"{extra['module_path']}.{extra['class_name']}"), page
        VaultSettings.from_extra({**extra["tierkv"], "config_path": toml}, "sglang")


def test_the_lmcache_config_names_the_connector_and_its_settings(toml: str) -> None:
    yaml = pytest.importorskip("yaml")
    page = (ROOT / "docs" / "engines" / "lmcache.md").read_text()
    (block,) = [b for b in FENCE.findall(page) if "remote_storage_plugins" in b]
    config = yaml.safe_load(block)
    (plugin,) = config["remote_storage_plugins"]
    prefix = f"remote_storage_plugin.{plugin}."
    ours = {k.removeprefix(prefix): v for k, v in config["extra_config"].items() if k.startswith(prefix)}
    assert resolves(f"{ours.pop('module_path')}.{ours.pop('class_name')}")
    VaultSettings.from_extra({**ours, "config_path": toml}, "lmcache")
