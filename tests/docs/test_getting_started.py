"""The getting-started pages run as written (see :mod:`tests.docs.snippets`), against real vaults on loopback.

The engine pages run in their engine's environment: vLLM's in the vLLM tier (``.venv-vllm``), MLX's in the
MLX tier, with ``MODEL`` pointing at a small random-weight model written here (nothing is downloaded).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.snippets import check_skippable, runnable, script, steps

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "getting-started"


def run_page(name: str, tmp_path: Path, timeout: float, **env: str) -> str:
    """Run one page in ``tmp_path`` (also ``$HOME``); its output, or a failure showing it."""
    (tmp_path / "run.sh").write_text(runnable(PAGES / name))
    bin_dir = str(Path(sys.executable).parent)
    environ = {
        **os.environ,
        "HOME": str(tmp_path),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "TIERKV_CONFIG": "",
        **env,
    }
    environ.pop("TIERKV_CONFIG")
    done = subprocess.run(
        ["bash", str(tmp_path / "run.sh")],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{name} failed (exit {done.returncode}):\n{output[-6000:]}"
    return output


def test_every_page_is_runnable_as_parsed() -> None:
    """Every getting-started page parses: known directives, runnable languages, honest install blocks."""
    for page in sorted(PAGES.glob("*.md")):
        assert script(page), page.name
        assert any(s.code for s in steps(page.read_text())), page.name


def test_a_skipped_block_may_only_hold_what_its_kind_allows() -> None:
    check_skippable("python3 -m venv ~/x && ~/x/bin/pip install tierkv\n~/x/bin/pip uninstall -y torchvision")
    check_skippable("tierkv exo status --python /x/bin/python   # a comment", "exo")
    with pytest.raises(ValueError, match="more than that"):
        check_skippable("python3 -m venv ~/x && ~/x/bin/pip install tierkv && tierkv vault &")
    with pytest.raises(ValueError, match="more than that"):
        check_skippable("tierkv exo status\nrm -rf /tmp/x", "exo")


def test_install_page(tmp_path: Path) -> None:
    assert "tierkv 0." in run_page("install.md", tmp_path, timeout=120)


def test_first_vault_page(tmp_path: Path) -> None:
    out = run_page("first-vault.md", tmp_path, timeout=180)
    assert "stored: 1 restored: True block-1 missing: True" in out


@pytest.mark.slow
def test_transformers_page(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the hf extra is not installed here")
    from tests.connectors.vllm.engine import write_tiny_llama

    model = write_tiny_llama(tmp_path / "model")
    (tmp_path / "run").mkdir()
    out = run_page("transformers.md", tmp_path / "run", timeout=600, MODEL=str(model))
    assert "restored from the vaults: 0 of" in out, "the first run restores nothing"
