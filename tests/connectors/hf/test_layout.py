"""Cache layout probing, cache building and block blobs, without vaults."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from tests.connectors.hf.models import ATTENTION_FAMILIES, HYBRID_FAMILIES, prompt, tiny_model
from tierkv.codec import LayerGroup
from tierkv.connectors.hf.blocks import ModelBlocks
from tierkv.connectors.hf.layout import (
    build_cache,
    check_continuation,
    extract_kv,
    probe_layout,
    snapshot_states,
)
from tierkv.connectors.hf.session import TieredSession
from tierkv.errors import ConfigError
from tierkv.tiering import ColdTier, MemoryStorage, StreamSpec
from tierkv.tiering.tensors import TorchArrays

CPU = torch.device("cpu")
NS = b"n" * 32


def _filled(family: str, length: int = 40) -> tuple[object, DynamicCache]:
    model = tiny_model(family)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt(length), past_key_values=cache, use_cache=True)
    return model, cache


@pytest.mark.parametrize("family", ATTENTION_FAMILIES + HYBRID_FAMILIES)
def test_probe_finds_attention_and_states(family: str) -> None:
    layout = probe_layout(tiny_model(family))
    assert layout.has_kv
    assert layout.has_states == (family in HYBRID_FAMILIES)
    assert layout.kv_heads == 2 and layout.kv_dtype == torch.float32
    if family == "falcon_h1":  # every layer holds both KV and a recurrent state
        assert {s.layer for s in layout.recurrent} == set(layout.attention_layers)
    elif layout.has_states:
        assert {s.layer for s in layout.recurrent}.isdisjoint(layout.attention_layers)


@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_build_cache_round_trip(family: str) -> None:
    model, cache = _filled(family)
    layout = probe_layout(model)
    kv = extract_kv(layout, cache)
    snap = snapshot_states(layout, cache) if layout.has_states else None
    rebuilt = build_cache(model, layout, kv, snap)
    for (k0, v0), (k1, v1) in zip(kv, extract_kv(layout, rebuilt), strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
        assert k0.data_ptr() != k1.data_ptr()  # a copy: generation never writes into the hot tier
    if snap is not None:
        again = snapshot_states(layout, rebuilt)
        before, after = snap.recurrent + snap.conv, again.recurrent + again.conv
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def _tier() -> tuple[MemoryStorage, ColdTier[torch.Tensor]]:
    storage = MemoryStorage()
    return storage, ColdTier(storage, TorchArrays())


def _keys(n: int, tag: bytes = b"kv") -> list[bytes]:
    return [tag + bytes([i]) * 31 for i in range(n)]


@pytest.mark.parametrize("codec", ["raw", "int8"])
def test_kv_blocks_round_trip(codec: str) -> None:
    model, cache = _filled("qwen2")
    layout = probe_layout(model)
    kv = extract_kv(layout, cache)
    blocks = ModelBlocks(layout, 16)
    spec = StreamSpec(NS, LayerGroup.ATTENTION, codec)
    _, tier = _tier()
    tier.store(spec, [(k, blocks.kv_block(kv, i), 16) for i, k in enumerate(_keys(2))])
    out = blocks.kv_buffer(48, CPU)
    got = tier.restore(
        spec,
        _keys(3),
        blocks.kv_expect(spec),
        lambda n: out[:, :, :, n * 16 : (n + 1) * 16],
        leading_only=True,
    )
    assert got.leading == 2 and got.failed == [2]
    ref = torch.stack([torch.stack((k[0, :, :32], v[0, :, :32])) for k, v in kv])
    err = (out[:, :, :, :32] - ref).abs().max().item()
    if codec == "raw":
        assert err == 0.0
    else:
        assert 0.0 < err < 0.02 * ref.abs().max().item()


def test_tampered_or_misplaced_blobs_are_rejected() -> None:
    model, cache = _filled("qwen3_next")
    layout = probe_layout(model)
    kv = extract_kv(layout, cache)
    blocks = ModelBlocks(layout, 16)
    spec = StreamSpec(NS, LayerGroup.ATTENTION, "raw")
    storage, tier = _tier()
    tier.store(spec, [(k, blocks.kv_block(kv, i), 16) for i, k in enumerate(_keys(2))])
    space = storage.blobs[("kv_cold", NS)]
    bad = bytearray(space[_keys(2)[1]])
    bad[-5] ^= 0x40
    space[_keys(2)[1]] = bytes(bad)
    out = blocks.kv_buffer(32, CPU)
    slot = lambda n: out[:, :, :, n * 16 : (n + 1) * 16]
    got = tier.restore(spec, _keys(2), blocks.kv_expect(spec), slot, leading_only=True)
    assert got.leading == 1 and got.rejected == 1 and _keys(2)[1] not in space
    # A blob encoded with another codec or block size is refused too.
    int8 = StreamSpec(NS, LayerGroup.ATTENTION, "int8")
    assert tier.restore(spec, _keys(1), blocks.kv_expect(int8), slot).rejected == 1
    tier.store(spec, [(k, blocks.kv_block(kv, i), 16) for i, k in enumerate(_keys(1))])
    assert tier.restore(spec, _keys(1), ModelBlocks(layout, 8).kv_expect(spec), slot).rejected == 1

    snap = snapshot_states(layout, cache)
    assert blocks.state_groups() == [LayerGroup.SSM, LayerGroup.CONV]
    ssm = StreamSpec(NS, LayerGroup.SSM, "int8")
    arrays = blocks.state_arrays(snap)
    keys = {g: _keys(1, tag) for g, tag in ((LayerGroup.SSM, b"s"), (LayerGroup.CONV, b"c"))}

    def restore(position: int, order: tuple[LayerGroup, ...] = (LayerGroup.SSM, LayerGroup.CONV)) -> int:
        for g in order:
            tier.store(ssm.sibling(g), [(keys[g][0], arrays[g], 32)])
        flats = blocks.state_buffers(CPU)
        got = tier.restore(
            ssm, [keys[g][0] for g in order], blocks.state_expects(ssm, position), flats.__getitem__
        )
        if got.leading == 2:
            restored = blocks.snapshot(flats)
            for a, b in zip(snap.recurrent + snap.conv, restored.recurrent + restored.conv, strict=True):
                assert torch.equal(a, b)
        return got.leading

    assert restore(32) == 2
    assert restore(48) == 0, "a snapshot of another position"
    assert restore(32, (LayerGroup.CONV, LayerGroup.SSM)) == 0, "groups swapped"
    assert storage.blobs[("ssm_cold", NS)] == {}, "every rejected state blob was deleted"


@pytest.mark.slow
def test_models_that_cannot_continue_over_a_cache_are_refused() -> None:
    jamba = tiny_model("jamba")
    with pytest.raises(ConfigError, match="continued over its cache"):
        check_continuation(jamba)
    with pytest.raises(ConfigError):
        TieredSession(jamba)
    check_continuation(tiny_model("qwen3_next"))


def test_sliding_window_models_are_refused() -> None:
    with pytest.raises(ConfigError, match="sliding-window"):
        probe_layout(tiny_model("mistral"))
