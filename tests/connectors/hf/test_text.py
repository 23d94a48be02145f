"""Character-level prefix reuse with a real byte-level BPE tokenizer trained here on our own text."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.connectors.hf.models import bakery_tokenizer, tiny_llama
from tierkv.connectors.hf import TieredSession, encode_with_offsets

pytest.importorskip("tokenizers")

TURN1 = (
    "System: You are a helpful assistant for a small bakery.\n"
    "User: What bread do you bake on Mondays?\nAssistant: "
)
NEW = 12


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return bakery_tokenizer()


@pytest.fixture
def model(tokenizer: Any) -> Any:
    return tiny_llama(tokenizer.get_vocab_size())


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text).ids)


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _reference(model: Any, ids: list[int]) -> list[int]:
    t = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=NEW, do_sample=False)
    return list(out[0, len(ids) :].tolist())


def test_bpe_is_not_compositional_at_the_seam(tokenizer: Any) -> None:
    """The premise: the stored turn's tokens are not a prefix of the next turn's tokens."""
    turn2 = TURN1 + "On Mondays we bake sourdough."
    first, second = _ids(tokenizer, TURN1), _ids(tokenizer, turn2)
    assert second[: len(first)] != first  # "Assistant: " ends in a bare space; " On" merges it


def test_exact(model: Any, tokenizer: Any) -> None:
    s = TieredSession(model, None, block_size=16)
    s.generate_text(TURN1, tokenizer, max_new_tokens=NEW)
    reply = s.generate_text(TURN1, tokenizer, max_new_tokens=NEW)
    n = len(_ids(tokenizer, TURN1))
    assert s.last_stats.text_match == "exact" and s.last_stats.reused_text_tokens == n
    assert s.last_stats.restored_tokens == n - 1
    assert reply == tokenizer.decode(_reference(model, _ids(tokenizer, TURN1)))


def test_extend_reuses_the_reply_where_tokens_do_not(model: Any, tokenizer: Any) -> None:
    s = TieredSession(model, None, block_size=16)
    reply = s.generate_text(TURN1, tokenizer, max_new_tokens=NEW)
    entry = s.text_index.best(TURN1 + reply)
    assert entry is not None and entry.text == TURN1 + reply
    stored = list(entry.ids)  # the prompt's tokens, then the generated ones
    turn2 = TURN1 + reply + "\nUser: And on Fridays?\nAssistant: "

    # Token-level matching: the re-tokenized conversation departs from the stored tokens early.
    token_level = _lcp(_ids(tokenizer, turn2), stored)
    assert token_level < len(stored) - 1

    out = s.generate_text(turn2, tokenizer, max_new_tokens=NEW)
    stats = s.last_stats
    assert stats.text_match == "extend"
    assert stats.reused_text_tokens == len(stored) > token_level
    assert stats.source == "hot" and stats.restored_tokens >= len(stored) - 1
    # The tokens run are the stored ones plus the new text tokenized alone; output is exact for them.
    used = stored + _ids(tokenizer, turn2[len(TURN1 + reply) :])
    assert out == tokenizer.decode(_reference(model, used))


def test_diverge_trims_to_the_matching_point(model: Any, tokenizer: Any) -> None:
    s = TieredSession(model, None, block_size=16, min_text_fraction=0.8)
    long_text = (
        TURN1 + "On Mondays we bake sourdough, rye and a seeded loaf.\nUser: Do you have gluten free options?"
    )
    s.generate_text(long_text, tokenizer, max_new_tokens=NEW)
    edited = long_text[:-9] + "rye bread?"  # the last words changed: > 80% of the text still matches
    s.generate_text(edited, tokenizer, max_new_tokens=NEW)
    stats = s.last_stats
    assert stats.text_match == "diverge"
    kept = encode_with_offsets(tokenizer, long_text).tokens_within(len(long_text) - 9)
    assert stats.reused_text_tokens == kept > 0
    assert stats.restored_tokens == kept

    # Below the threshold the stored text is not trusted: start over (nothing reused by text).
    s.generate_text(TURN1[:20] + "Tell me a story about bread.", tokenizer, max_new_tokens=NEW)
    assert s.last_stats.text_match == "none" and s.last_stats.reused_text_tokens == 0


def test_transformers_fast_tokenizer_gives_the_same_spans(tokenizer: Any) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    text = TURN1 + "Un pain frais, s'il vous plaît — merci!"
    assert encode_with_offsets(fast, text) == encode_with_offsets(tokenizer, text)
    spans = encode_with_offsets(tokenizer, text)
    assert spans.ends[-1] == len(text) and list(spans.ids) == _ids(tokenizer, text)
