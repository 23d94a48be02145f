"""The MLX getting-started page, run as written with mlx-lm on CPU and a real vault."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed here (make test-mlx builds .venv-mlx)")

from tests.connectors.mlx.models import save_model
from tests.docs.test_getting_started import run_page

pytestmark = [pytest.mark.mlx, pytest.mark.timeout(600)]


def test_mlx_page(tmp_path: Path) -> None:
    model = save_model("llama", tmp_path / "model")
    (tmp_path / "run").mkdir()
    out = run_page("mlx.md", tmp_path / "run", timeout=540, MODEL=str(model))
    assert "restored from the vaults: 0 of" in out, "the first run restores nothing"
