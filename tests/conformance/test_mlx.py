"""The conformance kit for the mlx-lm hook (:class:`~tierkv.connectors.mlx.MlxTier`).

The engine is mlx-lm on the CPU with a tiny random-weight llama built in code. A request is what a
server does with the hook: ``prepare`` (the longest stored prefix restored into a fresh prompt cache),
mlx-lm's own ``generate_step`` over the rest for a few greedy tokens, then ``store``. The output is the
tokens and the log-probabilities of every step, compared bit for bit with ``generate_step`` over the
whole prompt in a fresh cache. The lease check is skipped: ``prepare`` looks up and loads in one call.
(Snapshot layers, which go to the ``ssm_cold`` role, are covered by the MLX tier's own vault tests.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip(
    "mlx.core", reason="mlx is not installed here (scripts/setup-mlx-env.sh builds .venv-mlx)"
)

from tests.conformance.kit import Driver, HookCase
from tests.conformance.suite import KitSuite
from tests.connectors.mlx.models import Run, run, tiny_model
from tierkv.connectors.mlx import MlxTier
from tierkv.tiering import Storage

pytestmark = pytest.mark.mlx


class MlxDriver(Driver):
    def __init__(self, model: Any, storage: Storage, block_tokens: int) -> None:
        self.model = model
        self.tier = MlxTier(model, storage, block_size=block_tokens)
        self.namespace = self.tier.kv_spec.namespace
        self.restored = 0

    def run(self, tokens: Sequence[int], layout: list[dict[str, Any]] | None = None) -> Run:
        prepared = self.tier.prepare(tokens)
        self.restored = prepared.restored
        out = run(self.model, prepared.remaining.tolist(), prepared.cache)
        self.tier.store(prepared, out.tokens, layout=layout)
        return out

    def restored_tokens(self) -> int:
        return self.restored

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        return self.tier.kv_keys(tokens, len(tokens) // self.tier.block_size)

    def close(self) -> None:
        """Nothing to wait for: :meth:`MlxTier.store` returns once the vaults answered."""


class MlxCase(HookCase):
    name = "mlx"
    block_tokens = 16

    def __init__(self) -> None:
        self.model = tiny_model("llama")

    def open(self, storage: Storage) -> Driver:
        return MlxDriver(self.model, storage, self.block_tokens)

    def reference(self, tokens: Sequence[int]) -> Run:
        return run(self.model, tokens)

    def same(self, a: Any, b: Any) -> bool:
        return bool(a.same_as(b))


@pytest.fixture(scope="module")
def mlx_case() -> MlxCase:
    return MlxCase()


class TestMlx(KitSuite):
    @pytest.fixture
    def case(self, mlx_case: MlxCase) -> HookCase:
        return mlx_case
