"""block_meta: a layout in, the metadata of each block of a chain out, keyed by block key."""

from __future__ import annotations

import hashlib

import pytest

from tierkv.retention import GENERATION, Chunk, LayoutError, Retention, RetentionClass, block_meta, chain_meta

BS = 4


def chain(n: int) -> list[bytes]:
    return [hashlib.sha256(bytes([i])).digest() for i in range(n)]


def test_every_block_gets_an_entry_and_uncovered_ones_stay_untagged_with_their_parent() -> None:
    keys = chain(4)
    meta = block_meta(keys, [{"tokens": [0, 6], "source": "rules"}], BS, first_parent=b"p")
    assert list(meta) == keys
    assert [m.source for m in meta.values()] == ["rules", "rules", "", ""]
    assert [m.tagged for m in meta.values()] == [True, True, False, False]
    assert [m.parent for m in meta.values()] == [b"p", *keys[:3]]


def test_tokens_past_the_prompt_are_generation_unless_a_prompt_chunk_protects_the_block() -> None:
    keys = chain(4)
    meta = block_meta(keys, [Chunk(0, 6, "identity")], BS, prompt_tokens=6)
    assert [m.source for m in meta.values()] == ["identity", "identity", GENERATION, GENERATION]
    assert meta[keys[3]].importance == Retention().meta(GENERATION).importance


def test_character_spans_and_configured_classes() -> None:
    offsets = [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 18), (18, 21), (21, 24)]
    rules = Retention(classes={"notes": RetentionClass("notes", 0.9, protected=True)})
    meta = block_meta(chain(2), [{"chars": [13, 24], "source": "notes"}], BS, rules, offsets=offsets)
    assert [(m.source, m.protected) for m in meta.values()] == [("", False), ("notes", True)]


def test_a_bad_layout_is_a_layout_error_naming_the_entry() -> None:
    with pytest.raises(LayoutError, match=r"layout\[1\]\.tokens"):
        block_meta(chain(1), [{"tokens": [0, 1]}, {"tokens": [3, 1]}], BS)
    with pytest.raises(LayoutError, match="offsets"):
        block_meta(chain(1), [{"chars": [0, 1]}], BS)


def test_chain_meta_sends_token_ids_only_where_warm_tokens_asks() -> None:
    keys, ids = chain(2), list(range(100, 108))
    assert chain_meta(keys, BS, Retention(), tokens=ids) is None  # off: the store stays untagged
    bare = chain_meta(keys, BS, Retention(warm_tokens=True), tokens=ids, first_parent=b"p")
    assert bare is not None
    assert [(m.tokens, m.parent, m.source) for m in bare.values()] == [
        ((100, 101, 102, 103), b"p", ""),
        ((104, 105, 106, 107), keys[0], ""),
    ]
    tagged = chain_meta(keys, BS, Retention(warm_tokens=True), layout=[Chunk(0, 4, "rules")], tokens=ids)
    assert tagged is not None and [(m.source, m.tokens[0]) for m in tagged.values()] == [
        ("rules", 100),
        ("", 104),
    ]
    no_ids = chain_meta(keys, BS, Retention(), layout=[Chunk(0, 4, "rules")], tokens=ids)
    assert no_ids is not None and all(m.tokens == () for m in no_ids.values())
