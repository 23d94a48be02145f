"""The generated pages (the configuration reference, the home page) and the Grafana dashboard stay true to
what they are made from."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import VaultFactory
from tests.ports import free_port
from tierkv.connectors.vllm.stats import COUNTERS

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "operations" / "grafana-dashboard.json"


def script_module(name: str) -> ModuleType:
    """``scripts/NAME.py``, imported as the documentation build imports it."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def reference_module() -> ModuleType:
    return script_module("config_reference")


def test_the_reference_documents_every_setting() -> None:
    page = reference_module().render()
    for key in ("`on_damage`", "`bulk_max_connections`", "`bulk_idle_timeout_s`", "`lookup_lease_ms`"):
        assert key in page
    assert "## `[retention.weights]`" in page and "## `[retention.classes.NAME]`" in page
    row = next(line for line in page.splitlines() if line.startswith("| `max_bytes`"))
    assert '`"8GiB"`' in row and "Byte budget" in row


def test_a_setting_missing_from_the_example_file_fails_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = reference_module()
    text = module.EXAMPLE.read_text()
    example = tmp_path / "tierkv.toml.example"
    example.write_text(re.sub(r"(?m)^on_damage = .*\n", "", text))
    monkeypatch.setattr(module, "EXAMPLE", example)
    with pytest.raises(module.Undocumented, match=r"vault\.on_damage"):
        module.render()


def test_the_home_page_is_the_readme_with_its_links_on_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    page = script_module("docs_hooks").on_page_markdown((ROOT / "docs" / "index.md").read_text(), page=None)
    for heading in re.findall(r"(?m)^#+ .*$", readme):
        assert heading in page
    targets = re.findall(r"\]\(([^)\s]+)\)", page)
    assert len(targets) >= 40, "the README's links to the manual are on the page"
    for target in targets:
        path = target.partition("#")[0]
        assert target.startswith("https://") or (ROOT / "docs" / path).is_file(), target


def test_a_readme_link_outside_the_manual_becomes_its_name() -> None:
    page = script_module("readme_page").render(
        "[LICENSE](LICENSE), [the unit](systemd/x.service), [a](docs/a/b.md#c), "
        "[b](https://x.org/docs/d), [c](#e)"
    )
    assert page == "`LICENSE`, the unit, [a](a/b.md#c), [b](https://x.org/docs/d), [c](#e)"


def test_no_comment_or_docstring_sends_readers_to_a_readme_section() -> None:
    """The README is a front page: what it once held in sections is on the docs site now, and the
    example config's comments (what `tierkv config init` writes and the reference shows) say where."""
    files = [*(ROOT / "tierkv").rglob("*.py"), ROOT / "tierkv" / "data" / "tierkv.toml.example"]
    stale = [
        f"{path.relative_to(ROOT)}: {hit}"
        for path in files
        for hit in re.findall(r'README,?\s*(?:#\s*)?"[^"]+"', path.read_text())
    ]
    assert not stale, stale


def dashboard_metrics() -> set[str]:
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    return set(re.findall(r"\btierkv_[a-z_]+", " ".join(exprs)))


def test_every_metric_the_dashboard_queries_exists(vault_factory: VaultFactory) -> None:
    port = free_port()
    vault_factory(extra_args=["--metrics-port", str(port)])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        exposed = set(re.findall(r"(?m)^# TYPE (\w+) ", reply.read().decode()))
    suffixes = ("_total", "_bucket", "_count", "_sum")
    connector = {f"tierkv_connector_{name}_total" for name in COUNTERS}
    queried = dashboard_metrics()
    assert any(m.startswith("tierkv_connector_") for m in queried)
    for metric in queried:
        base = next((metric.removesuffix(s) for s in suffixes if metric.endswith(s)), metric)
        assert metric in connector or base in exposed or metric in exposed, metric
