"""TieredSession with the hot tier only: exact greedy output after restoring from process memory."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.connectors.hf.models import (
    ATTENTION_FAMILIES,
    HYBRID_FAMILIES,
    MORE_HYBRID_FAMILIES,
    VOCAB,
    family_params,
    prompt,
    reference,
    tiny_model,
)
from tierkv.connectors.hf import TieredSession
from tierkv.errors import ConfigError

NEW = 16


def _check_hot_reuse(family: str, dtype: torch.dtype = torch.float32) -> None:
    model = tiny_model(family, dtype=dtype)
    session = TieredSession(model, None, block_size=16, state_stride_blocks=1)
    ids = prompt(45)
    ref = reference(model, ids, NEW)

    first = session.generate(ids, max_new_tokens=NEW)
    assert torch.equal(first, ref)
    assert session.last_stats.source == "none" and session.last_stats.computed_tokens == 45

    again = session.generate(ids, max_new_tokens=NEW)
    stats = session.last_stats
    assert torch.equal(again, ref)
    assert stats.source == "hot" and stats.restored_tokens == 44 and stats.computed_tokens == 1
    assert stats.hot_hits == 44 and stats.cold_hits == 0 and stats.bytes_fetched == 0

    # The next turn extends prompt + reply: everything the previous call cached is reused.
    longer = torch.cat([ref, prompt(7, seed=5)], dim=1)
    out = session.generate(longer, max_new_tokens=NEW)
    assert torch.equal(out, reference(model, longer, NEW))
    # Hybrid models whose decode path drifts from prefill keep no state snapshot after generation,
    # so they resume from the previous prompt's last snapshot instead.
    resumed = ref.shape[1] - 1 if session.decode_snapshots or not session.layout.has_states else 44
    assert session.last_stats.restored_tokens == resumed
    assert len(session.hot) == 1  # each later entry extends (supersedes) the one before


@pytest.mark.parametrize("family", family_params(ATTENTION_FAMILIES + HYBRID_FAMILIES))
def test_hot_restore_is_exact(family: str) -> None:
    _check_hot_reuse(family)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "qwen3_next", "falcon_h1"])
def test_hot_restore_is_exact_bf16(family: str) -> None:
    _check_hot_reuse(family, torch.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("family", MORE_HYBRID_FAMILIES)
def test_hot_restore_is_exact_more_hybrids(family: str) -> None:
    _check_hot_reuse(family)


def test_divergent_prompt_reuses_the_common_prefix() -> None:
    model = tiny_model("qwen3")
    session = TieredSession(model, None, block_size=16)
    base = prompt(40)
    session.generate(base, max_new_tokens=4)
    other = torch.cat([base[:, :23], (base[:, 23:] + 1) % VOCAB], dim=1)
    out = session.generate(other, max_new_tokens=NEW)
    assert torch.equal(out, reference(model, other, NEW))
    assert session.last_stats.restored_tokens == 23  # attention KV can be cut anywhere


def test_hybrid_restores_only_at_snapshots() -> None:
    model = tiny_model("granitemoehybrid")
    session = TieredSession(model, None, block_size=8, state_stride_blocks=2)
    base = prompt(40)
    session.generate(base, max_new_tokens=4)
    # Snapshots: 16, 32 (every 2 blocks of the prompt), 39 (len - 1), 40 (a block boundary reached
    # while decoding) and 43 (the end of the entry).
    assert sorted(session.hot.entries()[0].payload.states) == [16, 32, 39, 40, 43]
    other = torch.cat([base[:, :30], (base[:, 30:] + 1) % VOCAB], dim=1)
    out = session.generate(other, max_new_tokens=NEW)
    assert torch.equal(out, reference(model, other, NEW))
    assert session.last_stats.restored_tokens == 16  # the last snapshot inside the 30 shared tokens


def test_hot_tier_stays_within_its_budget() -> None:
    model = tiny_model("llama")
    session = TieredSession(model, None, block_size=16, hot_bytes=40_000)
    per_token = session.layout.kv_bytes_per_token()
    for seed in range(4):
        session.generate(prompt(60, seed=seed), max_new_tokens=4)
        assert session.hot.nbytes <= 40_000
    assert session.hot.evictions >= 2 and 40_000 // (63 * per_token) == len(session.hot)


def test_bad_requests_are_config_errors() -> None:
    session = TieredSession(tiny_model("llama"), None)
    with pytest.raises(ConfigError):
        session.generate(prompt(8).repeat(2, 1))
    with pytest.raises(ConfigError):
        session.generate(prompt(8), attention_mask=torch.tensor([[0] + [1] * 7]))
    for setting in ({"codec": "zstd"}, {"block_size": 0}, {"state_stride_blocks": 0}):
        with pytest.raises(ConfigError) as err:
            TieredSession(tiny_model("llama"), None, **setting)  # type: ignore[arg-type]
        assert err.value.key in setting
    out = session.generate(prompt(8)[0].tolist(), max_new_tokens=2)  # a plain list of ids works
    assert out.shape == (1, 10)


def test_namespace_separates_weights_and_codecs() -> None:
    a = TieredSession(tiny_model("llama", seed=0), None)
    b = TieredSession(tiny_model("llama", seed=1), None)
    c = TieredSession(tiny_model("llama", seed=0), None, codec="int8")
    d = TieredSession(tiny_model("llama", seed=0), None)
    assert len({a.namespace, b.namespace, c.namespace}) == 3
    assert a.namespace == d.namespace


def test_generation_passes_the_cache_by_the_name_transformers_takes() -> None:
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns, then goes in 5.40)."""
    model = tiny_model("llama")
    session = TieredSession(model, None, block_size=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        session.generate(prompt(45), max_new_tokens=2)
        session.generate(prompt(45), max_new_tokens=2)
    assert session.last_stats.source == "hot"
