"""TieredSession with a prompt layout: the blocks it stores carry the layout's tags; without one, nothing."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from tests.conftest import VaultFactory
from tests.connectors.hf.models import bakery_tokenizer, prompt, tiny_llama, tiny_model
from tierkv.client.cluster import Cluster
from tierkv.client.vault import VaultClient
from tierkv.connectors.hf import TieredSession
from tierkv.connectors.hf.hot import as_tokens
from tierkv.connectors.hf.payload import merge_meta
from tierkv.records import PutResult
from tierkv.retention import GENERATION, UNTAGGED, BlockMeta, Chunk, LayoutError, Retention, RetentionClass
from tierkv.roles import Role
from tierkv.tiering import MemoryStorage

BS = 16
LAYOUT = [
    {"tokens": [0, 20], "source": "axioms"},  # block 1 (16..32) straddles axioms and tools: axioms
    {"tokens": [20, 50], "source": "tools"},  # block 3 (48..64) straddles tools and generation: tools
]
NEW = 32  # 50 + 32 tokens: the cache holds 81, five full blocks; block 4 (64..80) is all generation


class Recording(MemoryStorage):
    """Keeps the keyword arguments of every put (an untagged store must be the call it always was)."""

    def __init__(self) -> None:
        super().__init__()
        self.put_kwargs: list[dict[str, object]] = []

    def put(
        self, namespace: bytes, items: Mapping[bytes, bytes], role: str = Role.KV_COLD, **kw: Any
    ) -> PutResult:
        self.put_kwargs.append(dict(kw))
        return super().put(namespace, items, role, **kw)


def stored(model: Any, layout: Any, **options: Any) -> tuple[TieredSession, Recording, torch.Tensor]:
    storage = Recording()
    session = TieredSession(model, storage, block_size=BS, state_stride_blocks=1, **options)
    out = session.generate(prompt(50), max_new_tokens=NEW, layout=layout)
    assert session.persist(timeout=60)
    return session, storage, out


def kv_keys(session: TieredSession, out: torch.Tensor, n: int) -> list[bytes]:
    return session.streams.kv_keys(as_tokens(out[0].numpy()), n)


def test_a_layout_tags_every_stored_block_and_generated_tokens_are_generation() -> None:
    model = tiny_model("llama")
    session, storage, out = stored(model, LAYOUT)
    keys = kv_keys(session, out, 5)
    meta = storage.meta[("kv_cold", session.namespace)]
    assert [meta[k].source for k in keys] == ["axioms", "axioms", "tools", "tools", GENERATION]
    assert meta[keys[1]].protected and meta[keys[4]].importance == Retention().meta(GENERATION).importance
    assert [meta[k].parent for k in keys] == [b"", *keys[:4]]
    assert set(meta) == set(storage.blobs[("kv_cold", session.namespace)])


def test_the_hot_entry_keeps_the_tags_until_the_store_ships_them_and_reuse_keeps_them() -> None:
    storage = MemoryStorage()
    session = TieredSession(tiny_model("llama"), storage, block_size=BS)
    out = session.generate(prompt(50), max_new_tokens=NEW, layout=[Chunk(0, 50, "rules")])
    (entry,) = session.hot.entries()
    assert entry.payload.meta is not None and [m.source for m in entry.payload.meta][:3] == ["rules"] * 3
    assert not any(storage.blobs.values()), "nothing is stored before the entry is evicted"
    # Later requests without a layout: one extends the entry (and supersedes it), one reuses a prefix
    # of it from the hot tier. Both store those blocks again, and must not strip their tags.
    longer = session.generate(out, max_new_tokens=20)
    session.generate(out[:, :70], max_new_tokens=4)
    assert len(session.hot) == 2 and session.persist(timeout=60)
    meta = storage.meta[("kv_cold", session.namespace)]
    keys = kv_keys(session, longer, 6)
    assert [meta[k].source for k in keys] == ["rules"] * 4 + [GENERATION, ""]


def test_a_superseded_entry_hands_its_tags_to_the_blocks_the_newer_one_left_untagged() -> None:
    a, b, g = BlockMeta("axioms"), BlockMeta("tools"), BlockMeta(GENERATION)
    assert merge_meta(None, None) is None and merge_meta(None, [a]) == [a] and merge_meta([a], None) == [a]
    assert merge_meta([UNTAGGED, b, UNTAGGED], [a, a]) == [a, b, UNTAGGED]
    assert merge_meta([g], [a, b]) == [g, b]


def test_without_a_layout_the_same_blobs_are_stored_with_no_metadata() -> None:
    model = tiny_model("llama")
    _, tagged_storage, tagged_out = stored(model, LAYOUT)
    _, plain_storage, plain_out = stored(model, None)
    assert torch.equal(tagged_out, plain_out)
    assert plain_storage.blobs == tagged_storage.blobs
    assert not any(plain_storage.meta.values())
    assert plain_storage.put_kwargs and all(kw == {} for kw in plain_storage.put_kwargs)


def test_hybrid_state_snapshots_take_the_tag_of_the_block_they_end() -> None:
    session, storage, _ = stored(tiny_model("qwen3_next"), [{"tokens": [0, 50], "source": "memories"}])
    states = storage.meta[("ssm_cold", session.namespace)]
    assert states and set(states) == set(storage.blobs[("ssm_cold", session.namespace)])
    assert {m.source for m in states.values()} <= {"memories", GENERATION}
    assert "memories" in {m.source for m in states.values()}


def test_configured_classes_and_a_bad_layout() -> None:
    rules = Retention(classes={"tools": RetentionClass("tools", 0.3, protected=True)})
    session, storage, _ = stored(tiny_model("llama"), LAYOUT, retention=rules)
    tools = [m for m in storage.meta[("kv_cold", session.namespace)].values() if m.source == "tools"]
    assert tools and all(m.protected and m.importance == 0.3 for m in tools)
    with pytest.raises(LayoutError, match=r"layout\[0\]\.chars: character spans need"):
        session.generate(prompt(8), layout=[{"chars": [0, 4], "source": "axioms"}])


def test_generate_text_maps_character_spans_through_the_tokenizer_offsets() -> None:
    tokenizer = bakery_tokenizer()
    storage = MemoryStorage()
    session = TieredSession(tiny_llama(tokenizer.get_vocab_size()), storage, block_size=4)
    system = "System: You are a helpful assistant for a small bakery.\n"
    text = system + "User: What bread do you bake on Mondays?\nAssistant: "
    layout = [{"chars": [0, len(system)], "source": "identity"}, {"chars": [len(system), len(text)]}]
    session.generate_text(text, tokenizer, max_new_tokens=4, layout=layout)
    assert session.persist(timeout=60)

    enc = tokenizer.encode(text)
    keys = session.streams.kv_keys(as_tokens(enc.ids), len(enc.ids) // 4)
    meta = storage.meta[("kv_cold", session.namespace)]
    system_tokens = sum(1 for s, _ in enc.offsets if s < len(system))
    for i, key in enumerate(keys):
        expected = "identity" if i * 4 < system_tokens else ""
        assert meta[key].source == expected, f"block {i}"


def test_a_real_vault_counts_the_stored_blocks_by_class(vault_factory: VaultFactory) -> None:
    vault = vault_factory("kv", role="kv_cold")
    with Cluster({"kv_cold": [vault.address]}, timeout=2.0) as cluster:
        session = TieredSession(tiny_model("llama"), cluster, block_size=BS)
        session.generate(prompt(50), max_new_tokens=NEW, layout=LAYOUT)
        assert session.persist(timeout=60) and session.stored_blobs == 5
    with VaultClient(vault.address) as client:
        classes = {c.source: c.keys for c in client.stats().classes}
    assert classes == {"axioms": 2, "tools": 2, GENERATION: 1}


def test_importing_the_hook_without_torch_names_the_extra() -> None:
    code = "import sys; sys.modules['torch'] = None; import tierkv.connectors.hf"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "tierkv.connectors.hf needs torch" in result.stderr and "tierkv[hf]" in result.stderr
