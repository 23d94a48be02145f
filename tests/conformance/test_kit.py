"""Every engine hook on every backend: the conformance kit (tests/conformance/kit.py says what it checks).

Cases: the toy hook (tests/conformance/toy_hook.py, the template) and the transformers hook on a tiny
random-weight model. Hooks whose engines need their own environment (vLLM, MLX) join with a case in their
tier's tests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from tests.conformance.kit import LAYOUT_SOURCE, Backend, Driver, HookCase, MemoryBackend, VaultBackend
from tests.conformance.toy_hook import ToyEngine, ToyHook
from tests.conftest import VaultFactory
from tierkv.tiering import Storage


class ToyDriver(Driver):
    def __init__(self, engine: ToyEngine, storage: Storage) -> None:
        self.hook = ToyHook(engine, storage)
        self.namespace = self.hook.spec.namespace

    def run(self, tokens: Sequence[int], layout: list[dict[str, Any]] | None = None) -> Any:
        return self.hook.run(tokens, layout)

    def restored_tokens(self) -> int:
        return self.hook.last.restored_tokens

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        return self.hook.keys(tokens)

    def lookup(self, tokens: Sequence[int]) -> int:
        return self.hook.lookup(tokens)

    def finish(self, tokens: Sequence[int], blocks: int) -> Any:
        cache = np.zeros((len(tokens), 2, 2, 2, 8), np.float32)
        start = self.hook.load(tokens, blocks, cache)
        self.hook.last.restored_tokens = start
        self.hook.engine.kv_rows(tokens, start, cache)
        return self.hook.engine.next_token(cache, len(tokens))

    def close(self) -> None:
        self.hook.close()


class ToyCase(HookCase):
    name = "toy"
    block_tokens = 16
    splits_lookup = True

    def __init__(self) -> None:
        self.engine = ToyEngine(self.block_tokens)

    def open(self, storage: Storage) -> Driver:
        return ToyDriver(self.engine, storage)

    def reference(self, tokens: Sequence[int]) -> Any:
        return self.engine.reference(tokens)


class HFDriver(Driver):
    def __init__(self, model: Any, storage: Storage) -> None:
        from tierkv.connectors.hf import TieredSession

        self.session = TieredSession(model, storage, block_size=HFCase.block_tokens)
        self.namespace = self.session.namespace

    def run(self, tokens: Sequence[int], layout: list[dict[str, Any]] | None = None) -> Any:
        import torch

        out = self.session.generate(torch.tensor([list(tokens)]), max_new_tokens=HFCase.new, layout=layout)
        assert self.session.persist(timeout=30)
        return out

    def restored_tokens(self) -> int:
        return int(self.session.last_stats.restored_tokens)

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        from tierkv.connectors.hf.hot import as_tokens

        return self.session.streams.kv_keys(as_tokens(list(tokens)), len(tokens) // HFCase.block_tokens)

    def close(self) -> None:
        self.session.close()


class HFCase(HookCase):
    name = "transformers"
    block_tokens = 16
    new = 4

    def __init__(self) -> None:
        self._model: Any = None

    @property
    def model(self) -> Any:
        if self._model is None:
            from tests.connectors.hf.models import tiny_model

            self._model = tiny_model("llama")
        return self._model

    def open(self, storage: Storage) -> Driver:
        return HFDriver(self.model, storage)

    def reference(self, tokens: Sequence[int]) -> Any:
        import torch

        from tests.connectors.hf.models import reference

        return reference(self.model, torch.tensor([list(tokens)]), self.new)

    def same(self, a: Any, b: Any) -> bool:
        import torch

        return bool(torch.equal(a, b))


CASES = [ToyCase(), HFCase()]


@pytest.fixture(params=CASES, ids=lambda c: c.name)
def case(request: pytest.FixtureRequest) -> HookCase:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=["memory", "vault"])
def backend(request: pytest.FixtureRequest, vault_factory: VaultFactory) -> Iterator[Backend]:
    made: Backend = MemoryBackend() if request.param == "memory" else VaultBackend(vault_factory)
    yield made
    made.close()


def stored(case: HookCase, backend: Backend, tokens: Sequence[int], layout: Any = None) -> Driver:
    writer = case.open(backend.storage)
    writer.run(tokens, layout)
    writer.close()
    return writer


def test_a_cold_restore_gives_the_reference_output(case: HookCase, backend: Backend) -> None:
    tokens = case.prompt(4 * case.block_tokens + 3)
    stored(case, backend, tokens)
    reader = case.open(backend.storage)
    assert case.same(reader.run(tokens), case.reference(tokens))
    assert reader.restored_tokens() == 4 * case.block_tokens
    reader.close()


def test_a_corrupt_block_is_recomputed_and_replaced(case: HookCase, backend: Backend) -> None:
    tokens = case.prompt(4 * case.block_tokens + 3)
    writer = stored(case, backend, tokens)
    backend.corrupt(writer.namespace, writer.keys(tokens)[2])
    reader = case.open(backend.storage)
    assert case.same(reader.run(tokens), case.reference(tokens))
    assert reader.restored_tokens() == 2 * case.block_tokens, "the blocks before the corrupt one"
    reader.close()
    again = case.open(backend.storage)
    again.run(tokens)
    assert again.restored_tokens() == 4 * case.block_tokens, "the corrupt blob was deleted and stored anew"
    again.close()


def test_a_vault_that_is_down_is_a_miss(case: HookCase, backend: Backend) -> None:
    tokens = case.prompt(3 * case.block_tokens + 1)
    stored(case, backend, tokens)
    backend.take_down()
    reader = case.open(backend.storage)
    assert case.same(reader.run(tokens), case.reference(tokens))
    assert reader.restored_tokens() == 0
    reader.close()


def test_a_partial_prefix_restores_the_shared_blocks(case: HookCase, backend: Backend) -> None:
    bt = case.block_tokens
    first = case.prompt(4 * bt + 3)
    stored(case, backend, first)
    second = first[: 2 * bt] + case.prompt(2 * bt + 5, seed=1)
    reader = case.open(backend.storage)
    assert case.same(reader.run(second), case.reference(second))
    assert reader.restored_tokens() == 2 * bt
    reader.close()


def test_layout_tags_arrive_with_the_blocks(case: HookCase, backend: Backend) -> None:
    bt = case.block_tokens
    tokens = case.prompt(3 * bt + 2)
    writer = stored(case, backend, tokens, [{"tokens": [0, bt], "source": LAYOUT_SOURCE}])
    first, second = writer.keys(tokens)[:2]
    assert backend.source_of(writer.namespace, first) == LAYOUT_SOURCE
    assert backend.source_of(writer.namespace, second) != LAYOUT_SOURCE


@pytest.mark.parametrize("where", ["memory", "vault"])
def test_looked_up_blocks_survive_a_flood_until_loaded(where: str, vault_factory: VaultFactory) -> None:
    case = ToyCase()  # every case whose lookup and load are separate steps
    chain = 4 * case.block_tokens + 1
    backend: Backend = MemoryBackend(capacity=8) if where == "memory" else VaultBackend(vault_factory, "4MiB")
    try:
        tokens = case.prompt(chain)
        stored(case, backend, tokens)
        reader = case.open(backend.storage)
        assert reader.lookup(tokens) == 4
        backend.flood(16 << 20 if where == "vault" else 64 * 4096)
        assert case.same(reader.finish(tokens, 4), case.reference(tokens))
        assert reader.restored_tokens() == 4 * case.block_tokens, "the lookup's leases kept them"
        reader.close()
    finally:
        backend.close()
