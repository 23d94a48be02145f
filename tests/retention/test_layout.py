"""Prompt layouts → block metadata: parsing, the more-protective rule, character spans, bad input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.retention import (
    UNTAGGED,
    BlockMeta,
    Chunk,
    Durability,
    LayoutError,
    Retention,
    RetentionClass,
    parse_layout,
    tag_blocks,
    with_parents,
)
from tierkv.retention.layout import token_span


def test_defaults_protect_axioms_identity_rules_and_rank_generation_lowest() -> None:
    r = Retention()
    assert {n for n, c in r.classes.items() if c.protected} == {"axioms", "identity", "rules"}
    assert min(r.classes.values(), key=lambda c: c.importance).name == "generation"
    gen = r.meta("generation")
    assert gen.durability is Durability.EPHEMERAL and gen.ttl_s == 15 * 60 and not gen.protected
    assert r.meta("axioms").ttl_s is None and r.meta("axioms").protected


def test_a_layout_tags_each_block_and_a_straddling_block_takes_the_more_protective_chunk() -> None:
    chunks = parse_layout(
        [
            {"tokens": [0, 40], "source": "axioms"},
            {"tokens": [40, 100], "source": "tools", "durability": "ephemeral"},
            {"tokens": [100, 130], "source": "generation"},
        ]
    )
    metas = tag_blocks(chunks, n_blocks=9, block_size=16)
    assert [m.source for m in metas] == ["axioms"] * 3 + ["tools"] * 3 + ["tools", "generation", "generation"]
    assert metas[2].protected, "block 32..48 straddles axioms and tools: axioms wins"
    assert metas[6].source == "tools", "block 96..112: tools (0.7) beats generation (0.1)"
    assert metas[3].durability is Durability.EPHEMERAL and metas[3].ttl_s == 15 * 60


def test_uncovered_blocks_stay_untagged_and_no_layout_means_no_metadata() -> None:
    metas = tag_blocks(parse_layout([{"tokens": [0, 16], "source": "rules"}]), n_blocks=3, block_size=16)
    assert metas[0].source == "rules" and metas[1:] == [UNTAGGED, UNTAGGED]
    assert tag_blocks([], 2, 16) == [UNTAGGED, UNTAGGED]
    assert not UNTAGGED.tagged and metas[0].tagged


def test_priority_maps_to_importance_and_explicit_values_win_over_the_class() -> None:
    [c] = parse_layout([{"tokens": [0, 8], "source": "axioms", "priority": 2, "protected": False}])
    [m] = tag_blocks([c], 1, 8)
    assert m.importance == pytest.approx(0.4) and not m.protected and m.durability is Durability.PERMANENT


def test_configured_classes_and_ttls_apply() -> None:
    r = Retention(
        classes={"persona": RetentionClass("persona", 0.8, Durability.SESSION, protected=True)},
        ttl_s={Durability.SESSION: 60.0},
    )
    [m] = tag_blocks(parse_layout([{"tokens": [0, 4], "source": "persona"}]), 1, 4, r)
    assert m.protected and m.ttl_s == 60.0 and m.importance == 0.8


def test_character_spans_map_through_the_tokenizer_offsets() -> None:
    offsets = [(0, 5), (5, 6), (6, 11), (11, 12), (12, 20)]
    assert token_span(offsets, 0, 6) == (0, 2)
    assert token_span(offsets, 6, 12) == (2, 4)
    assert token_span(offsets, 30, 40) == (0, 0)
    [c] = parse_layout([{"chars": [6, 20], "source": "memories"}], offsets=offsets)
    assert (c.start, c.stop) == (2, 5)
    with pytest.raises(LayoutError, match="offsets"):
        parse_layout([{"chars": [0, 3]}])


def test_parents_follow_the_chain() -> None:
    metas = with_parents([UNTAGGED] * 3, [b"a", b"b", b"c"], first_parent=b"p")
    assert [m.parent for m in metas] == [b"p", b"a", b"b"]


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("axioms", "expected a list"),
        ([3], r"layout\[0\]: expected an object"),
        ([{"source": "x"}], "exactly one of"),
        ([{"tokens": [0, 4], "chars": [0, 4]}], "exactly one of"),
        ([{"tokens": [5, 4]}], "start <= stop"),
        ([{"tokens": [0, True]}], "start <= stop"),
        ([{"tokens": [0, 4], "priority": 6}], "priority"),
        ([{"tokens": [0, 4], "priority": 2, "importance": 0.3}], "not both"),
        ([{"tokens": [0, 4], "importance": 1.5}], "importance"),
        ([{"tokens": [0, 4], "durability": "forever"}], "durability"),
        ([{"tokens": [0, 4], "source": 3}], "source"),
        ([{"tokens": [0, 4], "colour": "red"}], "unknown field"),
    ],
)
def test_bad_layouts_name_the_entry_and_the_field(layout: object, message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        parse_layout(layout)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 600) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
chunk_like = st.fixed_dictionaries(
    {"tokens": st.lists(st.integers(-3, 300), min_size=0, max_size=3)},
    optional={
        "source": st.sampled_from(["axioms", "tools", "generation", "", "custom"]) | json_values,
        "priority": st.integers(-1, 7) | json_values,
        "importance": st.floats(-1, 2) | json_values,
        "durability": st.sampled_from([d.value for d in Durability]) | json_values,
        "protected": st.booleans() | json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(chunk_like, max_size=6) | json_values)
def test_any_json_is_a_layout_or_a_layout_error(value: object) -> None:
    """Whatever a request body carries, the parser answers chunks or LayoutError, never another error."""
    try:
        chunks = parse_layout(json.loads(json.dumps(value)) if _jsonable(value) else value)
    except LayoutError:
        return
    metas = tag_blocks(chunks, 20, 16)
    assert len(metas) == 20 and all(isinstance(m, BlockMeta) for m in metas)


def _jsonable(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


spans = st.lists(
    st.tuples(
        st.integers(0, 200),
        st.integers(0, 60),
        st.sampled_from(["axioms", "identity", "rules", "tools", "memories", "context", "generation"]),
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(spans, st.integers(1, 32))
def test_every_block_gets_the_most_protective_chunk_it_overlaps(
    raw: list[tuple[int, int, str]], bs: int
) -> None:
    chunks = [Chunk(s, s + n, source=src) for s, n, src in raw]
    n_blocks = 240 // bs
    metas = tag_blocks(chunks, n_blocks, bs)
    r = Retention()
    for b, meta in enumerate(metas):
        over = [r.meta(c.source) for c in chunks if c.start < (b + 1) * bs and c.stop > b * bs]
        if not over:
            assert meta == UNTAGGED
            continue
        assert meta in over
        assert all(meta.protection() >= o.protection() for o in over)
