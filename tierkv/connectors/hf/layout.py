"""What a model's ``DynamicCache`` holds, and moving it in and out of one.

The layout is learned once per model by running a single token through it with a fresh
``DynamicCache(config=...)``: which layers hold attention KV (and their heads / head size / dtype),
and which hold conv and recurrent states of linear-attention / SSM mixers (and their shapes). That
works for every cache layer type transformers 5.x dispatches from ``config.layer_types`` without
hard-coding model families, and it is what restored blobs are checked against.

KV is kept per attention layer as ``[1, kv_heads, seq, head_dim]``. Recurrent and conv states
cannot be cropped back to an earlier position, so they are snapshotted (cloned) at the positions the
tiers may later restore to.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import (
    DummyLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionCacheLayerMixin,
)

from tierkv.errors import ConfigError

logger = logging.getLogger(__name__)

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class StateSpec:
    """One conv or recurrent state: cache layer, state index inside it, shape and dtype."""

    layer: int
    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class StateSnapshot:
    """Cloned conv and recurrent states at one position, in the layout's order."""

    conv: tuple[torch.Tensor, ...]
    recurrent: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.conv, *self.recurrent))


@dataclass(frozen=True)
class CacheLayout:
    """The per-layer shape of a model's cache (see the module docstring)."""

    num_layers: int
    attention_layers: tuple[int, ...]
    kv_heads: int
    head_dim: int
    kv_dtype: torch.dtype
    conv: tuple[StateSpec, ...]
    recurrent: tuple[StateSpec, ...]

    @property
    def has_states(self) -> bool:
        """True for hybrid / SSM models: restores need a state snapshot at the restore point."""
        return bool(self.conv or self.recurrent)

    @property
    def has_kv(self) -> bool:
        return bool(self.attention_layers)

    def block_shape(self, block_size: int) -> tuple[int, int, int, int, int]:
        """Shape of one block's KV across all attention layers: ``[layers, 2, kv_heads, block, head_dim]``."""
        return (len(self.attention_layers), 2, self.kv_heads, block_size, self.head_dim)

    def kv_bytes_per_token(self) -> int:
        item = torch.empty((), dtype=self.kv_dtype).element_size()
        return len(self.attention_layers) * 2 * self.kv_heads * self.head_dim * item

    def describe(self) -> str:
        """A stable text form, part of the namespace: blobs from another layout never match."""
        parts = [
            f"layers={self.num_layers}",
            f"attn={','.join(map(str, self.attention_layers))}",
            f"kv={self.kv_heads}x{self.head_dim}:{self.kv_dtype}",
        ]
        parts += [f"conv{s.layer}.{s.index}={s.shape}:{s.dtype}" for s in self.conv]
        parts += [f"rec{s.layer}.{s.index}={s.shape}:{s.dtype}" for s in self.recurrent]
        return ";".join(parts)


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter (where restored tensors go)."""
    device: torch.device = next(iter(model.parameters())).device
    return device


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``cache`` as the keyword ``model`` takes it: ``cache`` from transformers 5.24 on, where
    ``past_key_values`` warns and goes away in 5.40; ``past_key_values`` before."""
    forward: Any = type(model).forward
    return {_cache_keyword(forward): cache}


@functools.cache
def _cache_keyword(forward: Any) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def _layers(cache: DynamicCache) -> list[Any]:
    """The cache's layers, untyped: their kinds differ in attributes (KV, conv / recurrent states)."""
    layers: list[Any] = cache.layers
    return layers


def probe_layout(model: Any) -> CacheLayout:
    """Run one token through ``model`` and read the resulting cache's layout.

    Raises :class:`ConfigError` for cache layers tierkv cannot restore exactly: sliding-window KV
    (the cache keeps only the window, so earlier blocks cannot be extracted) and unknown layer kinds.
    """
    cache = DynamicCache(config=model.config)
    token = torch.zeros((1, 1), dtype=torch.long, device=model_device(model))
    with torch.no_grad():
        model(input_ids=token, use_cache=True, **cache_kwargs(model, cache))
    attention: list[int] = []
    kv_shapes: set[tuple[int, int, torch.dtype]] = set()
    conv: list[StateSpec] = []
    recurrent: list[StateSpec] = []
    for idx, layer in enumerate(_layers(cache)):
        if isinstance(layer, DummyLayer):
            continue
        if isinstance(layer, DynamicSlidingWindowLayer):
            raise ConfigError(
                "TieredSession", f"layer {idx}", "sliding-window attention layers are not supported"
            )
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            for j in range(layer.number_of_states):
                c = layer.conv_states[j]
                r = layer.recurrent_states[j]
                if c is not None:
                    conv.append(StateSpec(idx, j, tuple(c.shape), c.dtype))
                if r is not None:
                    recurrent.append(StateSpec(idx, j, tuple(r.shape), r.dtype))
        if isinstance(layer, DynamicLayer):
            if layer.keys is None or layer.keys.dim() != 4:
                continue
            attention.append(idx)
            kv_shapes.add((int(layer.keys.shape[1]), int(layer.keys.shape[3]), layer.keys.dtype))
        elif not isinstance(layer, LinearAttentionCacheLayerMixin):
            raise ConfigError(
                "TieredSession", f"layer {idx}", f"unsupported cache layer {type(layer).__name__}"
            )
    if len(kv_shapes) > 1:
        raise ConfigError(
            "TieredSession", "layers", f"attention layers differ in KV shape: {sorted(map(str, kv_shapes))}"
        )
    for name, specs in (("conv", conv), ("recurrent", recurrent)):
        if len({s.dtype for s in specs}) > 1:
            raise ConfigError("TieredSession", "layers", f"{name} states differ in dtype")
    heads, head_dim, dtype = kv_shapes.pop() if kv_shapes else (0, 0, next(iter(model.parameters())).dtype)
    if not attention and not conv and not recurrent:
        raise ConfigError("TieredSession", "model", "the model's cache holds nothing tierkv can store")
    layout = CacheLayout(
        num_layers=len(cache.layers),
        attention_layers=tuple(attention),
        kv_heads=heads,
        head_dim=head_dim,
        kv_dtype=dtype,
        conv=tuple(conv),
        recurrent=tuple(recurrent),
    )
    logger.debug("cache layout: %s", layout.describe())
    return layout


@dataclass(frozen=True)
class Continuation:
    """How closely a model's cached continuations match one full prefill (relative logit errors).

    ``decoded`` is ``None`` when the token-by-token path was not measured (models without recurrent
    state, whose decode state is never snapshotted).
    """

    chunked: float
    decoded: float | None

    def decode_matches_prefill(self, rtol: float = 5e-4) -> bool:
        """Whether state after token-by-token decoding may stand in for a prefill's state."""
        return self.decoded is not None and self.decoded <= rtol


def _forward(model: Any, ids: torch.Tensor, cache: DynamicCache, start: int) -> torch.Tensor:
    positions = torch.arange(start, start + ids.shape[1], device=ids.device).unsqueeze(0)
    logits: torch.Tensor = model(
        input_ids=ids, use_cache=True, position_ids=positions, **cache_kwargs(model, cache)
    ).logits
    return logits[0, -1].float()


def check_continuation(
    model: Any, length: int = 8, split: int = 5, rtol: float = 0.05, *, decode: bool = True
) -> Continuation:
    """Measure cached continuations against a full prefill; refuse models that cannot continue.

    Restoring a prefix and computing the rest is a prefill in two pieces over one cache. Some
    implementations restart the recurrent state on multi-token input with a cache (Jamba's torch
    path does); for them every restore would be wrong, so :class:`ConfigError` is raised. Rounding
    differences are parts per million of the logits in float32; a broken continuation is off by a
    tenth. With ``decode`` the token-by-token path is measured too: some recurrent kernels (Zamba2's)
    or bfloat16 step updates drift from the chunked scan by more than rounding, and then the state
    left behind by ``generate`` must not be reused as if it came from a prefill.
    """
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    device = model_device(model)
    ids = (torch.arange(1, length + 1, device=device) * 7919 % vocab).unsqueeze(0)
    decoded: torch.Tensor | None = None
    with torch.no_grad():
        full = model(input_ids=ids).logits[0, -1].float()
        chunked_cache = DynamicCache(config=model.config)
        _forward(model, ids[:, :split], chunked_cache, 0)
        chunked = _forward(model, ids[:, split:], chunked_cache, split)
        if decode:
            decode_cache = DynamicCache(config=model.config)
            decoded = _forward(model, ids[:, :split], decode_cache, 0)
            for pos in range(split, length):
                decoded = _forward(model, ids[:, pos : pos + 1], decode_cache, pos)
    scale = max(float(full.abs().max()), 1e-6)
    result = Continuation(
        chunked=float((full - chunked).abs().max()) / scale,
        decoded=None if decoded is None else float((full - decoded).abs().max()) / scale,
    )
    if not result.chunked <= rtol:
        raise ConfigError(
            "TieredSession",
            "model",
            f"{type(model).__name__} gives different logits when a prompt is continued over its cache "
            f"(relative error {result.chunked:.3g}); a restored prefix would not be exact",
        )
    return result


def extract_kv(layout: CacheLayout, cache: DynamicCache) -> list[KV]:
    """The cache's KV per attention layer (the cache's own tensors, not copies)."""
    layers = _layers(cache)
    return [(layers[i].keys, layers[i].values) for i in layout.attention_layers]


def snapshot_states(layout: CacheLayout, cache: DynamicCache) -> StateSnapshot:
    """Clone the cache's conv and recurrent states (they are updated in place by later tokens)."""
    layers = _layers(cache)
    conv = tuple(layers[s.layer].conv_states[s.index].detach().clone() for s in layout.conv)
    rec = tuple(layers[s.layer].recurrent_states[s.index].detach().clone() for s in layout.recurrent)
    return StateSnapshot(conv, rec)


def kv_nbytes(kv: Sequence[KV]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def build_cache(
    model: Any, layout: CacheLayout, kv: Sequence[KV] | None = None, states: StateSnapshot | None = None
) -> DynamicCache:
    """A fresh ``DynamicCache`` holding ``kv`` (per attention layer) and ``states``.

    Tensors are copied into the cache, so the hot tier's copies are never modified by generation.
    """
    cache = DynamicCache(config=model.config)
    layers = _layers(cache)
    if kv:
        for idx, (k, v) in zip(layout.attention_layers, kv, strict=True):
            layers[idx].update(k, v)
    if states is not None:
        for spec, t in zip(layout.conv, states.conv, strict=True):
            layers[spec.layer].update_conv_state(t, state_idx=spec.index)
        for spec, t in zip(layout.recurrent, states.recurrent, strict=True):
            layers[spec.layer].update_recurrent_state(t, state_idx=spec.index)
    return cache


__all__ = [
    "KV",
    "CacheLayout",
    "Continuation",
    "StateSnapshot",
    "StateSpec",
    "build_cache",
    "check_continuation",
    "extract_kv",
    "kv_nbytes",
    "model_device",
    "probe_layout",
    "snapshot_states",
]
