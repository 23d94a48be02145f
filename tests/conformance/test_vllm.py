"""The conformance kit for vLLM's connector (:class:`~tierkv.connectors.vllm.TierKVConnector`).

The engine is vLLM itself on CPU with a tiny random-weight Llama; the connector is given the kit's
storage through its one seam (``open_storage``, in a subclass vLLM loads by module path: see
``vllm_hook.py``). A request is what ``LLM.generate`` does: vLLM's scheduler asks the connector how many
tokens the vaults hold (its lookup, leased), its worker loads them, the rest is computed, and the finished
request's blocks are stored. For the lease check the request arrives and is looked up, the vault is
flooded, and only then does vLLM schedule it. The reference is an engine without a connector in a
process of its own; outputs are greedy tokens (equal) and their logprobs (within 1e-4).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.conformance.kit import HookCase
from tests.conformance.suite import KitSuite
from tests.conformance.vllm_hook import NEW_TOKENS, KitEngine, VllmCase
from tests.connectors.vllm.engine import write_tiny_llama
from tests.connectors.vllm.reference import ReferenceEngine

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def vllm_case(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmCase]:
    model = write_tiny_llama(tmp_path_factory.mktemp("kit-llama") / "m")
    reference = ReferenceEngine(Path(model), NEW_TOKENS)  # loads while the engine under test is built
    try:
        engine = KitEngine(model)
        try:
            yield VllmCase(engine, reference)
        finally:
            engine.shutdown()
    finally:
        reference.close()


class TestVllm(KitSuite):
    @pytest.fixture
    def case(self, vllm_case: VllmCase) -> HookCase:
        return vllm_case
