from __future__ import annotations

import pytest

from tierkv.connectors.hf.textmatch import (
    MatchKind,
    TextIndex,
    TokenizedText,
    common_prefix_chars,
    match_text,
    plan_text,
)


def char_encoder(text: str) -> TokenizedText:
    """One token per character pair: enough to check the bookkeeping without a tokenizer."""
    ids, starts, ends = [], [], []
    for i in range(0, len(text), 2):
        ids.append(sum(map(ord, text[i : i + 2])))
        starts.append(i)
        ends.append(min(i + 2, len(text)))
    return TokenizedText(text, tuple(ids), tuple(starts), tuple(ends))


def test_common_prefix_chars() -> None:
    assert common_prefix_chars("abcdef", "abcxyz") == 3
    assert common_prefix_chars("abc", "abc") == 3
    assert common_prefix_chars("abc", "abcd") == 3
    assert common_prefix_chars("", "abc") == 0
    assert common_prefix_chars("x" * 1000 + "a", "x" * 1000 + "b") == 1000


@pytest.mark.parametrize(
    ("stored", "new", "kind", "matched"),
    [
        ("hello world", "hello world", MatchKind.EXACT, 11),
        ("hello", "hello world", MatchKind.EXTEND, 5),
        ("hello world", "hello worms", MatchKind.DIVERGE, 9),
        ("hello world", "help", MatchKind.NONE, 3),
        ("", "abc", MatchKind.NONE, 0),
    ],
)
def test_match_text(stored: str, new: str, kind: MatchKind, matched: int) -> None:
    m = match_text(stored, new, min_fraction=0.8)
    assert m.kind is kind and m.matched_chars == matched


def test_tokens_within_never_splits_a_shared_span() -> None:
    # Tokens 1 and 2 share one character (a byte-level split): no cut between them.
    t = TokenizedText("ab\u00e9cd", (1, 2, 3, 4), (0, 2, 2, 3), (2, 3, 3, 5))
    assert t.tokens_within(5) == 4
    assert t.tokens_within(3) == 3
    assert t.tokens_within(2) == 1
    assert t.tokens_within(1) == 0


def test_plan_extend_reuses_stored_tokens_verbatim() -> None:
    stored = char_encoder("abcde")  # tokens: ab cd e
    plan = plan_text(stored, "abcdefgh", char_encoder)
    assert plan.kind is MatchKind.EXTEND and plan.reused_tokens == 3
    assert plan.tokenized.ids[:3] == stored.ids
    assert plan.tokenized.ids[3:] == char_encoder("fgh").ids
    assert plan.tokenized.text == "abcdefgh" and plan.tokenized.ends[-1] == 8


def test_plan_diverge_trims_or_starts_over() -> None:
    stored = char_encoder("abcdefghij")
    plan = plan_text(stored, "abcdefghXY", char_encoder, min_fraction=0.8)
    assert plan.kind is MatchKind.DIVERGE and plan.reused_tokens == 4
    assert plan.tokenized.text == "abcdefghXY"
    plan = plan_text(stored, "abcdXYZ", char_encoder, min_fraction=0.8)
    assert plan.kind is MatchKind.NONE and plan.reused_tokens == 0
    assert plan.tokenized == char_encoder("abcdXYZ")


def test_plan_exact_adds_no_tokens() -> None:
    stored = TokenizedText.atomic("generated reply", [7, 8, 9])
    plan = plan_text(stored, "generated reply", char_encoder)
    assert plan.kind is MatchKind.EXACT and plan.tokenized.ids == (7, 8, 9)
    # An atomic span is reused all or nothing.
    assert plan_text(stored, "generated repl", char_encoder, 0.5).reused_tokens == 0


def test_index_prefers_the_longest_reusable_match() -> None:
    index = TextIndex(max_entries=4)
    index.add(char_encoder("system: hi"))
    index.add(char_encoder("system: hi | user: a long question that changes"))
    index.add(char_encoder("zzz"))
    best = index.best("system: hi | user: other", min_fraction=0.8)
    # The long text matches 19 chars but below 80%; the short one is a full EXTEND.
    assert best is not None and best.text == "system: hi"
    index.add(char_encoder("system: hi | more"))
    assert index.best("system: hi | more!") is not None
    index.add(char_encoder("zzz"))
    assert len(index) == 4  # re-adding a text replaces it
    assert index.best("nothing alike") is None


def test_index_prefers_an_uncut_match_on_ties() -> None:
    index = TextIndex()
    index.add(char_encoder("prompt"))
    index.add(char_encoder("prompt and reply"))
    best = index.best("prompt", min_fraction=0.3)
    assert best is not None and best.text == "prompt"
    best = index.best("prompt and more", min_fraction=0.3)
    assert best is not None and best.text == "prompt and reply"


def test_index_is_bounded() -> None:
    index = TextIndex(max_entries=2, max_chars=100)
    for word in ("one", "two", "three"):
        index.add(char_encoder(word))
    assert len(index) == 2 and index.best("one") is None
    index.add(char_encoder("x" * 150))
    assert len(index) == 0
