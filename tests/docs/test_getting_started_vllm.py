"""The vLLM getting-started page, run as written against a real vLLM server (CPU) and a real vault."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.connectors.vllm.engine import write_tiny_llama
from tests.docs.test_getting_started import run_page

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


def test_vllm_page(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "model")
    (tmp_path / "run").mkdir()
    out = run_page("vllm.md", tmp_path / "run", timeout=840, MODEL=str(model))
    assert "same: True" in out
