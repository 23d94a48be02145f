"""TieredPromptCache (mlx-lm's server prompt cache with a cold tier) in-process, over MemoryStorage."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip(
    "mlx.core", reason="mlx is not installed here (scripts/setup-mlx-env.sh builds .venv-mlx)"
)

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from tests.connectors.mlx.models import prompt, run, tiny_model
from tierkv.connectors.mlx import MlxTier
from tierkv.connectors.mlx.server import TieredPromptCache
from tierkv.tiering.memory import MemoryStorage

pytestmark = pytest.mark.mlx


def _serve(cache: TieredPromptCache, model: Any, tokens: list[int]) -> list[int]:
    """What the server does for one prompt: nearest cache, generate, insert prompt + answer."""
    found, rest = cache.fetch_nearest_cache("key", tokens)
    filled = found if found is not None else make_prompt_cache(model)
    out = run(model, rest, filled).tokens
    cache.insert_cache("key", tokens + out[:-1], filled)
    return out


def _setup(family: str) -> tuple[Any, MemoryStorage, TieredPromptCache]:
    model = tiny_model(family)
    storage = MemoryStorage()
    tier = MlxTier(model, storage, block_size=16)
    return model, storage, TieredPromptCache(lambda key: tier if key == "key" else None, max_size=1)


def test_evicted_entry_is_shipped_and_restored_bit_identically() -> None:
    model, storage, cache = _setup("llama")
    a, b = prompt(70, seed=1), prompt(50, seed=2)
    first = _serve(cache, model, a)
    assert cache.shipped == 0 and not any(storage.blobs.values())
    _serve(cache, model, b)
    assert cache.shipped == 1
    found, rest = cache.fetch_nearest_cache("key", a)
    assert cache.restored == 1 and len(a) - len(rest) == 64
    assert run(model, rest, found).same_as(run(model, a))
    assert first == run(model, a).tokens


def test_memory_hit_does_not_ask_the_vaults() -> None:
    model, storage, cache = _setup("llama")
    a = prompt(70, seed=1)
    _serve(cache, model, a)
    lookups = storage.calls["lookup"]
    _, rest = cache.fetch_nearest_cache("key", [*a, 5, 6])
    assert len(rest) < 16 and storage.calls["lookup"] == lookups and cache.restored == 0


def test_hybrid_entry_ships_its_snapshot_only_on_a_block_boundary() -> None:
    model, storage, cache = _setup("llama_swa")
    on_boundary = prompt(64, seed=3)
    filled = make_prompt_cache(model)
    model(mx.array(on_boundary)[None], cache=filled)
    cache.insert_cache("key", on_boundary, filled)
    cache.insert_cache("key", prompt(40, seed=4), make_prompt_cache(model))  # evicts the first
    assert cache.shipped == 1
    assert {role for (role, _), blobs in storage.blobs.items() if blobs} == {"kv_cold", "ssm_cold"}
    longer = on_boundary + prompt(10, seed=5)
    found, rest = cache.fetch_nearest_cache("key", longer)
    assert len(longer) - len(rest) == 64
    assert run(model, rest, found).same_as(run(model, longer))
    off_boundary = prompt(70, seed=6)
    _serve(cache, model, off_boundary)
    cache.insert_cache("key", prompt(40, seed=7), make_prompt_cache(model))
    found, rest = cache.fetch_nearest_cache("key", off_boundary)
    assert found is None and rest == off_boundary  # KV alone does not make a hit for this model


def test_a_failing_store_does_not_break_eviction_and_other_models_are_untouched() -> None:
    model, storage, cache = _setup("llama")

    def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("vault client bug")

    storage.put = broken  # type: ignore[method-assign]
    _serve(cache, model, prompt(40, seed=1))
    _serve(cache, model, prompt(40, seed=2))
    assert len(cache) == 1 and cache.shipped == 0
    other, rest = cache.fetch_nearest_cache("other-model", prompt(40, seed=1))
    assert other is None and len(rest) == 40
