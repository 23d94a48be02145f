"""Cache layout probing, cache building and block blobs, without vaults."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from tests.connectors.hf_models import ATTENTION_FAMILIES, HYBRID_FAMILIES, prompt, tiny_model
from tierkv.codec import LayerGroup
from tierkv.connectors.hf.blocks import BlockCodec
from tierkv.connectors.hf.layout import (
    build_cache,
    check_continuation,
    extract_kv,
    probe_layout,
    snapshot_states,
)
from tierkv.connectors.hf.session import TieredSession
from tierkv.errors import ConfigError

CPU = torch.device("cpu")


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


@pytest.mark.parametrize("codec", ["raw", "int8"])
def test_kv_blocks_round_trip(codec: str) -> None:
    model, cache = _filled("qwen2")
    layout = probe_layout(model)
    kv = extract_kv(layout, cache)
    bc = BlockCodec(layout, 16, codec)
    blobs: list[bytes | memoryview | None] = [bc.encode_kv_block(kv, i) for i in range(2)]
    result = bc.decode_kv_blocks([*blobs, None], CPU)
    assert result.blocks == 2 and result.kv is not None
    ref = torch.stack([torch.stack((k[0, :, :32], v[0, :, :32])) for k, v in kv])
    err = (result.kv - ref).abs().max().item()
    if codec == "raw":
        assert err == 0.0
    else:
        assert 0.0 < err < 0.02 * ref.abs().max().item()
    # Behind a prefix (a hot entry's first block): one tensor, prefix first, then the decoded block.
    joined = bc.decode_kv_blocks([blobs[1]], CPU, kv, 16)
    assert joined.blocks == 1 and joined.kv is not None and joined.kv.shape == ref.shape
    assert torch.equal(joined.kv[:, :, :, :16], ref[:, :, :, :16])
    assert torch.equal(joined.kv[:, :, :, 16:], result.kv[:, :, :, 16:])


def test_tampered_or_misplaced_blobs_are_rejected() -> None:
    model, cache = _filled("qwen3_next")
    layout = probe_layout(model)
    kv = extract_kv(layout, cache)
    bc = BlockCodec(layout, 16, "raw")
    good = [bc.encode_kv_block(kv, i) for i in range(2)]
    bad = bytearray(good[1])
    bad[-5] ^= 0x40
    result = bc.decode_kv_blocks([good[0], bytes(bad)], CPU)
    assert result.blocks == 1 and result.rejected == 1
    # A blob encoded with another codec or block size is refused too.
    assert BlockCodec(layout, 16, "int8").decode_kv_blocks(good, CPU).blocks == 0
    assert BlockCodec(layout, 8, "raw").decode_kv_blocks(good, CPU).blocks == 0

    snap = snapshot_states(layout, cache)
    states = bc.encode_states(snap, 32)
    assert set(states) == {LayerGroup.SSM, LayerGroup.CONV}
    restored = bc.decode_states(dict(states), 32, CPU)
    assert restored is not None
    for a, b in zip(snap.recurrent + snap.conv, restored.recurrent + restored.conv, strict=True):
        assert torch.equal(a, b)
    assert bc.decode_states(dict(states), 48, CPU) is None  # snapshot of another position
    assert bc.decode_states({LayerGroup.SSM: states[LayerGroup.SSM], LayerGroup.CONV: None}, 32, CPU) is None
    swapped = {LayerGroup.SSM: states[LayerGroup.CONV], LayerGroup.CONV: states[LayerGroup.SSM]}
    assert bc.decode_states(swapped, 32, CPU) is None


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
