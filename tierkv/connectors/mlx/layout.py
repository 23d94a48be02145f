"""How one mlx-lm model's prompt cache maps onto tierkv blobs.

- **KV blocks**: every full-attention (``KVCache``) layer's keys and values of one block of tokens, in
  one array ``[kv_layers, kv_heads, block_size, k_dim + v_dim]`` (K and V joined on the last axis, so
  models whose K and V widths differ need no second layout), layer group ``ATTENTION`` → ``kv_cold``.
  A prefix is restored block by block and shared with every request that starts with it.
  Quantized layers (``QuantizedKVCache``: packed ``uint32`` values with scales and biases) are cut the
  same way, each token's six arrays side by side as bytes (``uint8``), so a restore is bit for bit.
- **Snapshots**: the other layers (``RotatingKVCache`` sliding windows, ``ArraysCache`` SSM / linear
  attention state) cannot be cut along tokens, so their whole state is kept at block boundaries: one
  *manifest* blob (float32, exact integers) that lists every snapshot layer's kind, integers and array
  shapes and dtypes, then one blob per array, all layer group ``SSM`` → ``ssm_cold``.

The manifest has a fixed length for a given layout, so it is verified like any block (shape, dtype,
tokens = the boundary) before a single field is read, and then every field is checked against the
layout: a manifest that passes its checksum but disagrees with the model is refused, not restored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import mlx.core as mx
import numpy as np
import numpy.typing as npt

from tierkv.codec import DTYPES
from tierkv.connectors.mlx.states import (
    INT_FIELDS,
    KINDS,
    KV,
    QUANTIZED,
    ROTATING,
    LayerState,
    LayoutError,
    kind_of,
    read_state,
)

log = logging.getLogger(__name__)

LAYOUT_VERSION: Final = "mlx-v1"
MANIFEST_VERSION: Final = 1
MAX_NDIM: Final = 6
"""Dimensions recorded per snapshot array (unused ones are 0)."""
EXACT_LIMIT: Final = 1 << 24
"""Every integer in a manifest is below this, so float32 holds it exactly."""

_KIND_IDS: Final = {kind: i + 1 for i, kind in enumerate(KINDS)}
_DTYPE_BY_ID: Final = {info.wire_id: info for info in DTYPES.values()}


def blob_dtype(array: npt.NDArray[Any]) -> str:
    """The blob dtype name of a numpy array from :func:`~tierkv.connectors.mlx.states.to_numpy`."""
    if array.dtype == np.uint16:
        return "bfloat16"
    name = array.dtype.name
    if name not in DTYPES:
        raise LayoutError(f"cache arrays of dtype {name} cannot be stored (supported: {sorted(DTYPES)})")
    return name


@dataclass(frozen=True)
class SnapshotLayer:
    """What the layout knows about one snapshot layer before any token: kind, array count, window."""

    index: int
    kind: str
    arrays: int
    keep: int = 0
    max_size: int = 0


@dataclass(frozen=True)
class MlxLayout:
    """A model's cache layout, found by :func:`probe`."""

    kinds: tuple[str, ...]
    kv_layers: tuple[int, ...]
    snapshots: tuple[SnapshotLayer, ...]
    kv_heads: int = 0
    k_dim: int = 0
    v_dim: int = 0
    kv_dtype: str = ""
    state_dtype: str = ""
    """dtype of the first snapshot array (the namespace dtype of models without full attention)."""
    quant: tuple[int, int] = (0, 0)
    """(group_size, bits) when the full-attention layers are ``QuantizedKVCache``."""
    parts: tuple[tuple[str, int], ...] = ()
    """Quantized layers only: each array's numpy dtype and values per token, keys' three then values'."""

    @property
    def has_kv(self) -> bool:
        return bool(self.kv_layers)

    @property
    def quantized(self) -> bool:
        return self.quant != (0, 0)

    @property
    def kv_kind(self) -> str:
        return QUANTIZED if self.quantized else KV

    @property
    def has_snapshots(self) -> bool:
        return bool(self.snapshots)

    def kv_block_shape(self, block_size: int) -> tuple[int, int, int, int]:
        width = sum(self.part_bytes) if self.quantized else self.k_dim + self.v_dim
        return (len(self.kv_layers), self.kv_heads, block_size, width)

    @property
    def part_bytes(self) -> tuple[int, ...]:
        """Bytes per token of each quantized array."""
        return tuple(np.dtype(dtype).itemsize * n for dtype, n in self.parts)

    @property
    def manifest_len(self) -> int:
        """float32 values in a snapshot manifest of this layout."""
        return 1 + sum(1 + len(INT_FIELDS[s.kind]) + s.arrays * (2 + MAX_NDIM) for s in self.snapshots)

    def describe(self) -> str:
        """The layout part of the namespace: anything that changes what a blob means is in it."""
        kv = f"kv{len(self.kv_layers)}x{self.kv_heads}x{self.k_dim}+{self.v_dim}:{self.kv_dtype}"
        if self.quantized:
            kv += f"q{self.quant[1]}g{self.quant[0]}[" + ",".join(f"{d}x{n}" for d, n in self.parts) + "]"
        snaps = ",".join(f"{s.index}{s.kind[0]}{s.arrays}w{s.max_size}k{s.keep}" for s in self.snapshots)
        return f"{LAYOUT_VERSION}/{kv}/snap[{snaps}]:{self.state_dtype}"


def probe(model: Any, cache: Sequence[Any]) -> MlxLayout:
    """Find ``model``'s layout by running one token through ``cache`` (a fresh prompt cache)."""
    kinds = tuple(kind_of(c) for c in cache)
    model(mx.array([[0]]), cache=list(cache))
    states = [read_state(c) for c in cache]
    kv_layers = tuple(i for i, k in enumerate(kinds) if k in (KV, QUANTIZED))
    snapshots = tuple(_snapshot_layer(i, c, states[i]) for i, c in enumerate(cache) if i not in kv_layers)
    state_dtype = blob_dtype(states[snapshots[0].index].arrays[0]) if snapshots else ""
    if not kv_layers:
        return MlxLayout(kinds, (), snapshots, state_dtype=state_dtype)
    kv_kinds = {kinds[i] for i in kv_layers}
    if len(kv_kinds) > 1:
        raise LayoutError("the cache mixes KVCache and QuantizedKVCache layers; quantize all or none")
    if kv_kinds == {QUANTIZED}:
        return _quantized_layout(kinds, kv_layers, snapshots, [states[i] for i in kv_layers], state_dtype)
    heads, k_dim, v_dim, dtype = _kv_geometry([states[i] for i in kv_layers])
    return MlxLayout(kinds, kv_layers, snapshots, heads, k_dim, v_dim, dtype, state_dtype)


def _quantized_layout(
    kinds: tuple[str, ...],
    kv_layers: tuple[int, ...],
    snapshots: tuple[SnapshotLayer, ...],
    states: Sequence[LayerState],
    state_dtype: str,
) -> MlxLayout:
    """The layout of quantized full-attention layers, which must all agree to stack in a block."""
    shapes = {
        (s.arrays[0].shape[1], s.ints[1:], tuple((a.dtype.name, a.shape[3]) for a in s.arrays))
        for s in states
    }
    if len(shapes) != 1:
        raise LayoutError(f"quantized layers differ in heads, (group_size, bits) or arrays: {shapes}")
    ((heads, (group_size, bits), parts),) = shapes
    k_dim, v_dim = parts[0][1] * 32 // bits, parts[3][1] * 32 // bits
    return MlxLayout(
        kinds, kv_layers, snapshots, heads, k_dim, v_dim, "uint8", state_dtype, (group_size, bits), parts
    )


def _snapshot_layer(index: int, cache: Any, state: LayerState) -> SnapshotLayer:
    if state.kind != ROTATING:
        return SnapshotLayer(index, state.kind, len(state.arrays))
    return SnapshotLayer(index, state.kind, len(state.arrays), int(cache.keep), int(cache.max_size))


def _kv_geometry(states: Sequence[LayerState]) -> tuple[int, int, int, str]:
    """(kv heads, k_dim, v_dim, dtype), which every full-attention layer must share to stack in a block."""
    geometry = {(s.arrays[0].shape[1], s.arrays[0].shape[3], s.arrays[1].shape[3]) for s in states}
    dtypes = {blob_dtype(a) for s in states for a in s.arrays}
    if len(geometry) != 1 or len(dtypes) != 1:
        raise LayoutError(
            f"full-attention layers differ in (heads, k_dim, v_dim) {geometry} or dtype {dtypes}"
        )
    ((heads, k_dim, v_dim),) = geometry
    return heads, k_dim, v_dim, dtypes.pop()


# ------------------------------------------------------------------------------------------- KV blocks


def kv_blocks(
    layout: MlxLayout, cache: Sequence[Any], start: int, stop: int, block_size: int
) -> Iterator[npt.NDArray[Any]]:
    """The KV block arrays ``start .. stop-1`` of a filled prompt cache (one layer read at a time)."""
    joined = []
    for i in layout.kv_layers:
        state = read_state(cache[i])
        if state.kind != layout.kv_kind:
            raise LayoutError(f"layer {i} holds a {state.kind}, the layout has {layout.kv_kind}")
        rows = (
            [a[0].view(np.uint8) for a in state.arrays] if layout.quantized else [a[0] for a in state.arrays]
        )
        joined.append(np.concatenate(rows, axis=-1))
    for b in range(start, stop):
        s, e = b * block_size, (b + 1) * block_size
        yield np.stack([j[:, s:e] for j in joined])


def kv_states(layout: MlxLayout, blocks: npt.NDArray[Any]) -> list[LayerState]:
    """Per full-attention layer, the :class:`LayerState` of decoded blocks ``[n, layers, heads, bs, d]``."""
    n, _, heads, block_size, width = blocks.shape
    tokens = n * block_size
    out = []
    for layer in range(len(layout.kv_layers)):
        joined = blocks[:, layer].transpose(1, 0, 2, 3).reshape(1, heads, tokens, width)
        if layout.quantized:
            out.append(_quantized_state(layout, joined, tokens))
            continue
        keys = np.ascontiguousarray(joined[..., : layout.k_dim])
        values = np.ascontiguousarray(joined[..., layout.k_dim :])
        out.append(LayerState(KV, (keys, values), (tokens,)))
    return out


def _quantized_state(layout: MlxLayout, joined: npt.NDArray[Any], tokens: int) -> LayerState:
    """One quantized layer's six arrays back from its bytes per token."""
    arrays, start = [], 0
    for (dtype, _), size in zip(layout.parts, layout.part_bytes, strict=True):
        arrays.append(np.ascontiguousarray(joined[..., start : start + size]).view(dtype))
        start += size
    return LayerState(QUANTIZED, tuple(arrays), (tokens, *layout.quant))


# ------------------------------------------------------------------------------------------- snapshots


def manifest(layout: MlxLayout, states: Sequence[LayerState]) -> npt.NDArray[np.float32]:
    """The manifest of one snapshot (one state per snapshot layer, in layout order)."""
    values: list[int] = [MANIFEST_VERSION]
    for spec, state in zip(layout.snapshots, states, strict=True):
        values += [_KIND_IDS[state.kind], *state.ints]
        for a in state.arrays:
            if a.ndim > MAX_NDIM:
                raise LayoutError(f"a {state.kind} array has {a.ndim} dimensions (at most {MAX_NDIM})")
            values += [DTYPES[blob_dtype(a)].wire_id, a.ndim, *a.shape, *[0] * (MAX_NDIM - a.ndim)]
        if len(state.arrays) != spec.arrays:
            raise LayoutError(f"layer {spec.index}: {len(state.arrays)} arrays, the layout has {spec.arrays}")
    if any(not 0 <= v < EXACT_LIMIT for v in values):
        raise LayoutError("a snapshot integer is outside what a manifest holds exactly")
    return np.asarray(values, np.float32)


@dataclass(frozen=True)
class ArraySpec:
    """One snapshot array as its manifest describes it."""

    dtype: str
    shape: tuple[int, ...]

    def empty(self) -> npt.NDArray[Any]:
        return np.empty(self.shape, DTYPES[self.dtype].storage)


@dataclass(frozen=True)
class LayerSpec:
    kind: str
    ints: tuple[int, ...]
    arrays: tuple[ArraySpec, ...]


class _Reader:
    def __init__(self, values: npt.NDArray[np.float32]) -> None:
        if values.ndim != 1 or not values.size:
            raise LayoutError(f"a manifest is a non-empty vector, got shape {values.shape}")
        if (
            not np.all(np.isfinite(values))
            or not np.array_equal(values, np.round(values))
            or values.min() < 0
        ):
            raise LayoutError("manifest holds values that are not non-negative integers")
        self.values = [int(v) for v in values]
        self.pos = 0

    def take(self, n: int = 1) -> list[int]:
        if self.pos + n > len(self.values):
            raise LayoutError("manifest is shorter than its layout")
        out = self.values[self.pos : self.pos + n]
        self.pos += n
        return out


def parse_manifest(layout: MlxLayout, values: npt.NDArray[np.float32], position: int) -> list[LayerSpec]:
    """Check a decoded manifest against ``layout`` and the boundary ``position``; the layers it lists."""
    reader = _Reader(values)
    if reader.take()[0] != MANIFEST_VERSION:
        raise LayoutError("unknown manifest version")
    out = [_parse_layer(reader, spec, position) for spec in layout.snapshots]
    if reader.pos != len(reader.values):
        raise LayoutError("manifest is longer than its layout")
    return out


def _parse_layer(reader: _Reader, spec: SnapshotLayer, position: int) -> LayerSpec:
    (kind_id,) = reader.take()
    if kind_id != _KIND_IDS[spec.kind]:
        raise LayoutError(f"layer {spec.index}: manifest kind {kind_id}, the layout has {spec.kind}")
    ints = tuple(reader.take(len(INT_FIELDS[spec.kind])))
    if spec.kind == ROTATING:
        offset, keep, max_size, idx = ints
        if (offset, keep, max_size) != (position, spec.keep, spec.max_size) or idx > offset:
            raise LayoutError(f"layer {spec.index}: rotating state {ints} does not fit position {position}")
    arrays = []
    for _ in range(spec.arrays):
        dtype_id, ndim, *dims = reader.take(2 + MAX_NDIM)
        info = _DTYPE_BY_ID.get(dtype_id)
        if info is None or not 1 <= ndim <= MAX_NDIM or any(dims[ndim:]) or dims[0] != 1:
            raise LayoutError(f"layer {spec.index}: bad array entry {dtype_id}/{ndim}/{dims}")
        arrays.append(ArraySpec(info.name, tuple(dims[:ndim])))
    if spec.kind == ROTATING and not (arrays[0].shape[2] == arrays[1].shape[2] <= position):
        raise LayoutError(f"layer {spec.index}: rotating arrays {arrays} do not fit position {position}")
    return LayerSpec(spec.kind, ints, tuple(arrays))


def snapshot_arrays(states: Sequence[LayerState]) -> list[npt.NDArray[Any]]:
    """Every array of a snapshot, in manifest order."""
    return [a for s in states for a in s.arrays]


def snapshot_states(specs: Sequence[LayerSpec], arrays: Sequence[npt.NDArray[Any]]) -> list[LayerState]:
    """The snapshot layers' states from a parsed manifest and its decoded arrays."""
    out, pos = [], 0
    for spec in specs:
        n = len(spec.arrays)
        out.append(LayerState(spec.kind, tuple(arrays[pos : pos + n]), spec.ints))
        pos += n
    return out


__all__ = [
    "LAYOUT_VERSION",
    "ArraySpec",
    "LayerSpec",
    "MlxLayout",
    "SnapshotLayer",
    "blob_dtype",
    "kv_blocks",
    "kv_states",
    "manifest",
    "parse_manifest",
    "probe",
    "snapshot_arrays",
    "snapshot_states",
]
