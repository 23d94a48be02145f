"""The conformance kit for the llama.cpp hook (:class:`~tierkv.connectors.llamacpp.LlamaTier`).

The engine is llama-cpp-python itself on a tiny random-weight llama GGUF written in code. A request is
what ``Llama.generate`` does with the tier's cache: restore the longest stored prefix into the context,
evaluate the rest and a few greedy tokens, then store the sequence. The output is the greedy tokens and
the logits of every step, compared bit for bit with a fresh context's one-batch eval of the prompt
(without flash attention, so that a split eval rounds as a whole one does). The lease check is skipped:
the hook's restore looks up and loads in one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (make test-llamacpp)")

from tests.conformance.kit import Driver, HookCase
from tests.conformance.suite import KitSuite
from tests.connectors.llamacpp.models import Run, greedy, make_llm, model_file, prompt, reference
from tierkv.connectors.llamacpp import LlamaTier
from tierkv.tiering import Storage

pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(300)]

STEPS = 4


class LlamaDriver(Driver):
    def __init__(self, path: Path, storage: Storage, block_tokens: int) -> None:
        self.llm = make_llm(path, flash=False)
        self.tier = LlamaTier(self.llm, storage, block_size=block_tokens)
        self.namespace = self.tier.spec.namespace
        self.restored = 0

    def run(self, tokens: Sequence[int], layout: list[dict[str, Any]] | None = None) -> Run:
        self.restored = self.tier.restore(tokens).tokens
        out = greedy(self.llm, tokens[self.restored :], STEPS)
        assert self.tier.store(layout=layout)
        return out

    def restored_tokens(self) -> int:
        return self.restored

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        return self.tier.keys(tokens, len(tokens) // self.tier.block_size)

    def close(self) -> None:
        assert self.tier.close(60)
        self.llm.close()


class LlamaCase(HookCase):
    name = "llamacpp"
    block_tokens = 16

    def __init__(self, root: Path) -> None:
        self.path = model_file(root, "tiny")

    def open(self, storage: Storage) -> Driver:
        return LlamaDriver(self.path, storage, self.block_tokens)

    def reference(self, tokens: Sequence[int]) -> Run:
        return reference(self.path, tokens, STEPS, flash=False)

    def same(self, a: Any, b: Any) -> bool:
        return bool(a.same_as(b))

    def prompt(self, n: int, seed: int = 0) -> list[int]:
        return prompt(n, seed=seed + 11)


@pytest.fixture(scope="module")
def llama_case(tmp_path_factory: pytest.TempPathFactory) -> LlamaCase:
    return LlamaCase(tmp_path_factory.mktemp("gguf"))


class TestLlamaCpp(KitSuite):
    @pytest.fixture
    def case(self, llama_case: LlamaCase) -> HookCase:
        return llama_case
