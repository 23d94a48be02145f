"""The page table's event bookkeeping, on events shaped as vLLM's msgspec encoding decodes them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import VaultFactory
from tierkv.routing.pages import Page, Residency, label, parse_replica, replica_pages, table


def stored(hashes: list[int], parent: int | None, tokens: list[int], medium: str = "GPU") -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": 2,
        "lora_id": None,
        "medium": medium,
    }


def removed(hashes: list[int], medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def test_chains_follow_parents_and_removals_cut_them() -> None:
    events = [
        stored([1, 2], None, [10, 11, 12, 13]),
        stored([3], 2, [14, 15]),
        stored([4], 1, [20, 21]),  # a branch after the first block
        stored([1, 2, 3], None, [10, 11, 12, 13, 14, 15], "STORAGE"),
    ]
    pages = replica_pages("r0", events)
    gpu = sorted((p.tokens, p.preview[:4]) for p in pages if p.where == "gpu")
    assert gpu == [(4, (10, 11, 20, 21)), (6, (10, 11, 12, 13))]
    assert [(p.where, p.blocks) for p in pages if p.where == "vault"] == [("vault", 3)]

    after = replica_pages("r0", [*events, removed([3]), removed([2], "STORAGE")])
    assert sorted(p.tokens for p in after if p.where == "gpu") == [4, 4]
    assert [p.tokens for p in after if p.where == "vault"] == [2]


def test_all_blocks_cleared_empties_the_gpu_only() -> None:
    events = [stored([1], None, [5, 6]), stored([1], None, [5, 6], "STORAGE"), {"type": "AllBlocksCleared"}]
    assert [(p.where, p.tokens) for p in replica_pages("r", events)] == [("vault", 2)]


def test_rows_are_labelled_from_the_vault_chain_they_start_with() -> None:
    vault = Page("vault", "127.0.0.1:1", 3, 6, (10, 11, 12, 13), "acme", "system")
    gpu = Page("gpu", "r0", 2, 4, (10, 11, 12, 13))
    other = Page("gpu", "r1", 1, 2, (7, 8))
    rows = label([gpu, other, vault])
    assert (rows[0].tenant, rows[0].source) == ("acme", "system")
    assert (rows[1].tenant, rows[1].source) == ("", "")
    text = "\n".join(table(rows))
    assert "tenant acme  class system" in text and "tenant -  class -" in text


def test_parse_replica() -> None:
    assert parse_replica("a=tcp://127.0.0.1:5") == ("a", "tcp://127.0.0.1:5")
    assert parse_replica("tcp://127.0.0.1:5") == ("tcp://127.0.0.1:5", "tcp://127.0.0.1:5")
    for bad in ("a=", "a=http://x:1", "=tcp://127.0.0.1:5", "nonsense"):
        with pytest.raises(ValueError, match="--replica"):
            parse_replica(bad)


@given(
    st.text(max_size=12),
    st.sampled_from(["", "=", "=tcp://", "tcp://", "=ipc://", "=http://"]),
    st.text(max_size=20),
)
def test_any_replica_argument_parses_or_is_a_clear_error(head: str, middle: str, tail: str) -> None:
    value = head + middle + tail
    try:
        name, endpoint = parse_replica(value)
    except ValueError as exc:
        assert "--replica" in str(exc)
    else:
        assert name and endpoint.startswith(("tcp://", "ipc://")) and value.endswith(endpoint)


events = st.dictionaries(
    st.sampled_from(["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "medium"]),
    st.one_of(
        st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]),
        st.integers(),
        st.lists(st.integers(), max_size=4),
        st.lists(st.binary(max_size=9), max_size=3),
        st.none(),
        st.text(max_size=4),
    ),
)


@given(st.lists(st.one_of(events, st.integers(), st.none(), st.lists(st.integers())), max_size=8))
def test_garbage_events_are_skipped_never_raised(garbage: list[Any]) -> None:
    residency = Residency()
    for event in garbage:
        residency.apply(event)
    for medium in list(residency.media):
        for chain in residency.chains(medium):
            assert chain


def test_a_malformed_replica_is_a_clear_error(tmp_path: Path) -> None:
    from tests.test_cli import tierkv

    done = tierkv("pages", "--replica", "r0=http://127.0.0.1:1", "--vault", "127.0.0.1:1", cwd=tmp_path)
    assert done.returncode == 2
    assert "expected NAME=tcp://HOST:PORT" in done.stderr and "Traceback" not in done.stderr


def test_vault_rows_count_tokens_by_the_block_headers_and_the_table_names_its_columns(
    vault_factory: VaultFactory,
) -> None:
    """Blocks of 16 tokens (as the blob headers say) are counted as 16 tokens, not the 32 assumed before."""
    import numpy as np

    from tierkv import VaultClient
    from tierkv.codec import encode
    from tierkv.routing.pages import vault_pages

    vault = vault_factory()
    with VaultClient(vault.address) as client:
        blob = encode(np.zeros((2, 16, 4), dtype=np.float32), tokens=16)
        assert client.put(b"ns16", {b"a": blob, b"b": blob, b"c": blob}) == 3
        (total, *_) = vault_pages(client, block_tokens=32)
    assert total.blocks == 3 and total.tokens == 48
    lines = table([dataclasses.replace(total, holder=vault.address)])
    assert lines[0].split()[:5] == ["where", "held", "by", "blocks", "tokens"]
    assert lines[2].split()[:4] == ["vault", vault.address, "3", "48"]
