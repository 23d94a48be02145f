"""The mlx-lm codec without vaults: cache APIs (0.32 real, 0.31 stand-ins), manifests, the layout, restores.

The 0.32+ API is the installed mlx-lm's own classes; the 0.31 API (EXO's fork) is tested against the
stand-ins of ``legacy_api``, since one environment cannot hold both releases.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip(
    "mlx.core", reason="mlx is not installed here (scripts/setup-mlx-env.sh builds .venv-mlx)"
)

import mlx.core as mx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models import cache as mlx_cache

from tests.connectors.mlx import legacy_api
from tests.connectors.mlx.models import FAMILIES, prompt, run, tiny_model
from tierkv.codec import LayerGroup, read_header
from tierkv.connectors.mlx import LayoutError, MlxTier, probe
from tierkv.connectors.mlx.layout import MlxLayout, kv_blocks, kv_states, manifest, parse_manifest
from tierkv.connectors.mlx.states import is_legacy, read_state, rebuild
from tierkv.tiering.memory import MemoryStorage

pytestmark = pytest.mark.mlx


def _filled(family: str, length: int = 40, dtype: str = "float32") -> tuple[Any, list[Any]]:
    model = tiny_model(family, dtype)
    cache = mlx_cache.make_prompt_cache(model)
    model(mx.array(prompt(length))[None], cache=cache)
    mx.eval([c.state for c in cache])
    return model, cache


def _same_state(a: Any, b: Any) -> None:
    assert a.kind == b.kind and a.ints == b.ints
    assert [x.dtype for x in a.arrays] == [y.dtype for y in b.arrays]
    assert all(np.array_equal(x, y) for x, y in zip(a.arrays, b.arrays, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_state_round_trip_continues_bit_identically(family: str) -> None:
    model, cache = _filled(family)
    states = [read_state(c) for c in cache]
    rebuilt = [rebuild(t, s) for t, s in zip(mlx_cache.make_prompt_cache(model), states, strict=True)]
    for s, c in zip(states, rebuilt, strict=True):
        _same_state(s, read_state(c))
    rest = prompt(48)[40:]
    assert run(model, rest, rebuilt).same_as(run(model, rest, cache))


def test_kv_state_is_cut_to_offset_and_keeps_bfloat16_bits() -> None:
    _, cache = _filled("llama", 40, "bfloat16")
    state = read_state(cache[0])
    assert cache[0].keys.shape[2] == 256  # mlx-lm pads its buffer; only the tokens held are read
    assert state.ints == (40,) and state.arrays[0].shape[2] == 40 and state.arrays[0].dtype == np.uint16
    back = rebuild(mlx_cache.KVCache(), state)
    assert back.keys.dtype == mx.bfloat16
    assert np.array_equal(
        np.array(back.keys.view(mx.uint16)), np.array(cache[0].keys[..., :40, :].view(mx.uint16))
    )


@pytest.mark.parametrize("family", ["llama_swa", "qwen3_next"])
def test_legacy_api_reads_like_the_current_one_and_rebuilds_its_own_class(family: str) -> None:
    _, cache = _filled(family)
    for current in cache:
        twin = legacy_api.from_current(current)
        assert is_legacy(twin) and not is_legacy(current)
        state = read_state(twin)
        _same_state(state, read_state(current))
        template = legacy_api.from_current(current)
        back = rebuild(template, state)
        assert type(back) is type(twin)
        _same_state(read_state(back), state)
        if type(back).__name__ == "RotatingKVCache":
            assert back.meta_state == twin.meta_state
        if type(back).__name__ == "ArraysCache":
            assert back.left_padding is None and back.lengths is None


def test_legacy_rebuild_continues_generation_when_put_back_into_current_classes() -> None:
    model, cache = _filled("llama_swa")
    states = [read_state(legacy_api.from_current(c)) for c in cache]
    rebuilt = [rebuild(t, s) for t, s in zip(mlx_cache.make_prompt_cache(model), states, strict=True)]
    rest = prompt(48)[40:]
    assert run(model, rest, rebuilt).same_as(run(model, rest, cache))


def test_unsupported_caches_are_refused_with_their_name() -> None:
    model = tiny_model("llama")
    concatenating = [mlx_cache.ConcatenateKVCache() for _ in model.layers]
    with pytest.raises(LayoutError, match="ConcatenateKVCache is not supported"):
        probe(model, concatenating)
    batched = mlx_cache.make_prompt_cache(model)
    model(mx.array([prompt(8), prompt(8, seed=1)]), cache=batched)
    with pytest.raises(LayoutError, match="batch 1"):
        read_state(batched[0])


@pytest.mark.parametrize("family", ["llama_swa", "qwen3_next", "mamba"])
def test_manifest_round_trip_and_every_field_checked(family: str) -> None:
    model, cache = _filled(family, 32)
    layout = probe(model, mlx_cache.make_prompt_cache(model))
    states = [read_state(cache[s.index]) for s in layout.snapshots]
    values = manifest(layout, states)
    assert values.shape == (layout.manifest_len,) and values.dtype == np.float32
    specs = parse_manifest(layout, values, 32)
    assert [a.shape for s in specs for a in s.arrays] == [a.shape for s in states for a in s.arrays]
    for i in range(len(values)):
        broken = values.copy()
        broken[i] += 1
        try:
            changed = parse_manifest(layout, broken, 32)
        except LayoutError:
            continue
        # Well-formed but different (an array's shape): that array's own header check refuses it.
        assert changed != specs, f"field {i} is not read"
    broken = values.copy()
    broken[0] += 1
    with pytest.raises(LayoutError, match="version"):
        parse_manifest(layout, broken, 32)
    if family == "llama_swa":
        with pytest.raises(LayoutError, match="does not fit position"):
            parse_manifest(layout, values, 48)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=0, max_size=40))
def test_manifest_parser_refuses_garbage_with_layout_errors_only(values: list[float]) -> None:
    layout = probe(tiny_model("llama_swa"), mlx_cache.make_prompt_cache(tiny_model("llama_swa")))
    try:
        specs = parse_manifest(layout, np.asarray(values, np.float32), 32)
    except LayoutError:
        return
    assert [s.kind for s in specs] == [s.kind for s in layout.snapshots]


def _stored(family: str, storage: MemoryStorage, length: int = 70) -> tuple[Any, list[int], Any]:
    model = tiny_model(family)
    ids = prompt(length)
    ref = run(model, ids)
    writer = MlxTier(model, storage, block_size=16, snapshot_every=2)
    prepared = writer.prepare(ids)
    assert prepared.restored == 0
    assert run(model, prepared.remaining.tolist(), prepared.cache).same_as(ref)
    tally = writer.store(prepared, ref.tokens)
    assert tally.stored == tally.sent > 0
    return model, ids, ref


@pytest.mark.parametrize("family", FAMILIES)
def test_restore_from_memory_is_bit_identical(family: str) -> None:
    storage = MemoryStorage()
    model, ids, ref = _stored(family, storage)
    reader = MlxTier(model, storage, block_size=16, snapshot_every=2)
    prepared = reader.prepare(ids)
    assert prepared.restored == 64 and prepared.rejected == 0
    assert run(model, prepared.remaining.tolist(), prepared.cache).same_as(ref)


def test_blobs_are_routed_by_role_and_other_models_do_not_match() -> None:
    storage = MemoryStorage()
    model, ids, _ = _stored("llama_swa", storage)
    tier = MlxTier(model, storage, block_size=16)
    roles = {role for role, ns in storage.blobs if ns == tier.namespace.digest}
    assert roles == {"kv_cold", "ssm_cold"}
    assert tier.kv_spec.layer_group is LayerGroup.ATTENTION and tier.snap_spec.role == "ssm_cold"
    other = MlxTier(tiny_model("llama"), storage, block_size=16)
    assert other.namespace != tier.namespace and other.prepare(ids).restored == 0
    assert MlxTier(model, storage, block_size=16, tenant="b").prepare(ids).restored == 0


@pytest.mark.parametrize(
    ("family", "role"), [("llama", "kv_cold"), ("llama_swa", "ssm_cold"), ("mamba", "ssm_cold")]
)
def test_corrupt_blob_is_a_miss_then_deleted_and_recomputed(family: str, role: str) -> None:
    storage = MemoryStorage()
    model, ids, ref = _stored(family, storage)
    tier = MlxTier(model, storage, block_size=16, snapshot_every=2)
    space = storage.blobs[(role, tier.namespace.digest)]
    # A blob the restore at 64 tokens needs: a KV block, or a part of the snapshot at 64.
    victim = next(k for k in sorted(space) if read_header(space[k]).tokens in (16, 64))
    blob = bytearray(space[victim])
    blob[len(blob) // 2] ^= 0x40
    space[victim] = bytes(blob)
    prepared = tier.prepare(ids)
    assert prepared.rejected == 1 and victim not in space and prepared.restored < 64
    assert run(model, prepared.remaining.tolist(), prepared.cache).same_as(ref)


def test_short_prompt_and_partial_block_leave_the_last_token_to_compute() -> None:
    storage = MemoryStorage()
    model, ids, _ = _stored("llama", storage, length=64)
    prepared = MlxTier(model, storage, block_size=16).prepare(ids)
    assert prepared.restored == 48 and len(prepared.remaining.tolist()) == 16
    assert MlxTier(model, storage, block_size=16).prepare(ids[:5]).restored == 0


def test_store_sends_only_the_blocks_the_vaults_lack() -> None:
    storage = MemoryStorage()
    model, ids, ref = _stored("llama", storage)
    tier = MlxTier(model, storage, block_size=16)
    prepared = tier.prepare(ids + ref.tokens + prompt(20, seed=5))
    assert prepared.restored == 64
    run(model, prepared.remaining.tolist(), prepared.cache, new=2)
    tally = tier.store(prepared)
    assert tally.sent == tally.stored == (70 + 8 + 20 + 1) // 16 - 4


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(1, 3),
    heads=st.integers(1, 3),
    k_dim=st.integers(1, 8),
    v_dim=st.integers(1, 8),
    block_size=st.integers(2, 5),
    blocks=st.integers(1, 4),
    extra=st.integers(0, 4),
)
def test_kv_blocks_split_and_join_back_exactly(
    layers: int, heads: int, k_dim: int, v_dim: int, block_size: int, blocks: int, extra: int
) -> None:
    tokens = blocks * block_size + extra
    rng = np.random.default_rng(tokens)
    keys = [rng.standard_normal((1, heads, tokens, k_dim), np.float32) for _ in range(layers)]
    values = [rng.standard_normal((1, heads, tokens, v_dim), np.float32) for _ in range(layers)]
    cache = [
        mlx_cache.KVCache.from_state((mx.array(k), mx.array(v), tokens))
        for k, v in zip(keys, values, strict=True)
    ]
    layout = MlxLayout(("KVCache",) * layers, tuple(range(layers)), (), heads, k_dim, v_dim, "float32")
    stacked = np.stack(list(kv_blocks(layout, cache, 0, blocks, block_size)))
    assert stacked.shape == (blocks, *layout.kv_block_shape(block_size))
    for state, k, v in zip(kv_states(layout, stacked), keys, values, strict=True):
        assert state.ints == (blocks * block_size,)
        assert np.array_equal(state.arrays[0], k[:, :, : blocks * block_size])
        assert np.array_equal(state.arrays[1], v[:, :, : blocks * block_size])
    tail = list(kv_blocks(layout, cache, blocks - 1, blocks, block_size))
    assert len(tail) == 1 and np.array_equal(tail[0], stacked[-1])


# ---------------------------------------------------------------------------- quantized KV (QuantizedKVCache)


def _quantized(model: Any, bits: int = 4) -> list[Any]:
    return [mlx_cache.QuantizedKVCache(group_size=32, bits=bits) for _ in model.layers]


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_state_round_trips_bit_for_bit_in_both_apis(bits: int) -> None:
    model = tiny_model("llama_hd32")
    cache = _quantized(model, bits)
    model(mx.array(prompt(40))[None], cache=cache)
    state = read_state(cache[0])
    assert state.kind == "QuantizedKVCache" and state.ints == (40, 32, bits)
    assert [a.dtype for a in state.arrays] == [np.uint32, np.float32, np.float32] * 2
    assert all(a.shape[2] == 40 for a in state.arrays)  # cut from mlx-lm's 256-token buffer
    twin = legacy_api.from_current(cache[0])
    _same_state(read_state(twin), state)
    back_legacy = rebuild(legacy_api.QuantizedKVCache(), state)
    assert type(back_legacy) is legacy_api.QuantizedKVCache and back_legacy.meta_state == twin.meta_state
    rebuilt = [rebuild(t, read_state(c)) for t, c in zip(_quantized(model, bits), cache, strict=True)]
    rest = prompt(48)[40:]
    assert run(model, rest, rebuilt).same_as(run(model, rest, cache))


def test_quantized_restore_is_bit_identical_to_a_full_quantized_prefill() -> None:
    model = tiny_model("llama_hd32")
    storage = MemoryStorage()
    writer = MlxTier(model, storage, block_size=16, make_cache=_quantized, codec="int8")
    assert writer.layout.quantized and writer.layout.kv_dtype == "uint8"
    assert writer.kv_spec.kv_codec == "raw"  # packed values are stored as they are
    ids = prompt(70, seed=1)
    prepared = writer.prepare(ids)
    writer.store(prepared, run(model, prepared.remaining.tolist(), prepared.cache).tokens)
    plain = MlxTier(model, storage, block_size=16)
    assert plain.namespace != writer.namespace and plain.prepare(ids).restored == 0
    eight = MlxTier(model, storage, block_size=16, make_cache=lambda m: _quantized(m, 8))
    other_bits = eight.restore(ids)  # same head geometry: only the bits in the namespace keep them apart
    assert eight.namespace != writer.namespace and other_bits.restored == other_bits.rejected == 0
    follow_up = [*ids, *prompt(20, seed=4)]
    reader = MlxTier(model, storage, block_size=16, make_cache=_quantized)
    restored = reader.prepare(follow_up)
    assert restored.restored == 64 and restored.rejected == 0
    assert all(type(c).__name__ == "QuantizedKVCache" for c in restored.cache)
    got = run(model, restored.remaining.tolist(), restored.cache)
    assert got.same_as(run(model, follow_up, _quantized(model)))
    fp32_block = 4 * 2 * 16 * (32 + 32) * 4
    assert restored.fetched_bytes < 4 * fp32_block / 4  # 4-bit values with fp32 scales and biases


def test_quantized_layout_refuses_mixed_layers_and_foreign_kinds() -> None:
    model = tiny_model("llama_hd32")
    mixed = [*_quantized(model)[:2], *mlx_cache.make_prompt_cache(model)[2:]]
    with pytest.raises(LayoutError, match="mixes KVCache and QuantizedKVCache"):
        probe(model, mixed)
    tier = MlxTier(model, MemoryStorage(), block_size=16, make_cache=_quantized)
    plain = mlx_cache.make_prompt_cache(model)
    model(mx.array(prompt(40))[None], cache=plain)
    with pytest.raises(LayoutError, match="holds a KVCache, the layout has QuantizedKVCache"):
        list(kv_blocks(tier.layout, plain, 0, 2, 16))
