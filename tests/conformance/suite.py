"""The conformance kit's checks, as one class every hook's test module subclasses with its ``case`` fixture.

``test_kit.py`` runs it for the hooks the main environment can run; an engine that needs its own
environment (llama.cpp, MLX, SGLang, vLLM) has a module of its own here, marked for its tier, with a
``TestX(KitSuite)`` class whose ``case`` fixture returns its :class:`~tests.conformance.kit.HookCase`.
What each check asks of a hook is said in ``kit.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tests.conformance.kit import LAYOUT_SOURCE, Backend, Driver, HookCase, MemoryBackend, VaultBackend
from tests.conftest import VaultFactory


def stored(case: HookCase, backend: Backend, tokens: Sequence[int], layout: Any = None) -> Driver:
    writer = case.open(backend.storage)
    writer.run(tokens, layout)
    writer.close()
    return writer


class KitSuite:
    """Every check of the kit; a subclass (named ``Test...``) provides the ``case`` fixture."""

    @pytest.fixture(params=["memory", "vault"])
    def backend(self, request: pytest.FixtureRequest, vault_factory: VaultFactory) -> Iterator[Backend]:
        made: Backend = MemoryBackend() if request.param == "memory" else VaultBackend(vault_factory)
        yield made
        made.close()

    def test_a_cold_restore_gives_the_reference_output(self, case: HookCase, backend: Backend) -> None:
        tokens = case.prompt(4 * case.block_tokens + 3)
        stored(case, backend, tokens)
        reader = case.open(backend.storage)
        assert case.same(reader.run(tokens), case.reference(tokens))
        assert reader.restored_tokens() == 4 * case.block_tokens
        reader.close()

    def test_a_corrupt_block_is_recomputed_and_replaced(self, case: HookCase, backend: Backend) -> None:
        tokens = case.prompt(4 * case.block_tokens + 3)
        writer = stored(case, backend, tokens)
        backend.corrupt(writer.namespace, writer.keys(tokens)[2])
        reader = case.open(backend.storage)
        assert case.same(reader.run(tokens), case.reference(tokens))
        assert reader.restored_tokens() == 2 * case.block_tokens, "the blocks before the corrupt one"
        reader.close()
        again = case.open(backend.storage)
        again.run(tokens)
        assert again.restored_tokens() == 4 * case.block_tokens, "the corrupt blob was deleted, stored anew"
        again.close()

    def test_a_vault_that_is_down_is_a_miss(self, case: HookCase, backend: Backend) -> None:
        tokens = case.prompt(3 * case.block_tokens + 1)
        stored(case, backend, tokens)
        backend.take_down()
        reader = case.open(backend.storage)
        assert case.same(reader.run(tokens), case.reference(tokens))
        assert reader.restored_tokens() == 0
        reader.close()

    def test_a_partial_prefix_restores_the_shared_blocks(self, case: HookCase, backend: Backend) -> None:
        bt = case.block_tokens
        first = case.prompt(4 * bt + 3)
        stored(case, backend, first)
        second = first[: 2 * bt] + case.prompt(2 * bt + 5, seed=1)
        reader = case.open(backend.storage)
        assert case.same(reader.run(second), case.reference(second))
        assert reader.restored_tokens() == 2 * bt
        reader.close()

    def test_layout_tags_arrive_with_the_blocks(self, case: HookCase, backend: Backend) -> None:
        if case.without_layout:
            pytest.skip(f"{case.name}: {case.without_layout}")
        bt = case.block_tokens
        tokens = case.prompt(3 * bt + 2)
        writer = stored(case, backend, tokens, [{"tokens": [0, bt], "source": LAYOUT_SOURCE}])
        first, second = writer.keys(tokens)[:2]
        assert backend.source_of(writer.namespace, first) == LAYOUT_SOURCE
        assert backend.source_of(writer.namespace, second) != LAYOUT_SOURCE

    @pytest.mark.parametrize("where", ["memory", "vault"])
    def test_looked_up_blocks_survive_a_flood_until_loaded(
        self, case: HookCase, where: str, vault_factory: VaultFactory
    ) -> None:
        if not case.splits_lookup:
            pytest.skip(f"{case.name}: lookup and load are one call, nothing is held between them")
        chain = 4 * case.block_tokens + 1
        small = MemoryBackend(capacity=8) if where == "memory" else VaultBackend(vault_factory, "4MiB")
        backend: Backend = small
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
