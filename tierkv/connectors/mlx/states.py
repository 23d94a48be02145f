"""mlx-lm cache objects as plain arrays and integers, for both cache APIs, and back.

mlx-lm changed how a cache exposes itself between releases:

- **0.32+**: ``state`` holds the arrays *and* the scalars (``KVCache.state == (keys, values, offset)``,
  the buffers padded to a multiple of 256 tokens), rebuilt with ``cls.from_state(state)``;
- **<= 0.31** (EXO pins a 0.31 fork): ``state`` holds only the arrays, cut to ``offset``; scalars are
  strings in ``meta_state``; rebuilt with ``cls.from_state(state, meta_state)``.

``QuantizedKVCache`` keeps keys and values as ``(packed uint32, scales, biases)`` triples; its state
is the six arrays (keys' three, then values') and ``(offset, group_size, bits)`` — in 0.31's
``meta_state`` as ``(step, offset, group_size, bits)``.

A :class:`LayerState` is the same for both: the arrays (as numpy, bfloat16 as ``uint16`` bits, cut to
the tokens they cover) and the integers of one layer's cache. The API is told apart by whether the
cache class has ``meta_state``. Only single-sequence caches are read (batch 1, no padding): those are
what ``generate`` / ``stream_generate`` and the server's prompt cache hold.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

import mlx.core as mx
import numpy as np
import numpy.typing as npt

from tierkv.errors import TierKVError

log = logging.getLogger(__name__)

KV: Final = "KVCache"
ROTATING: Final = "RotatingKVCache"
ARRAYS: Final = "ArraysCache"
QUANTIZED: Final = "QuantizedKVCache"
KINDS: Final = (KV, ROTATING, ARRAYS, QUANTIZED)
"""Cache classes the hook understands (their order numbers manifest entries: append only); a model
with any other layer cache is refused."""

INT_FIELDS: Final = {
    KV: ("offset",),
    ROTATING: ("offset", "keep", "max_size", "_idx"),
    ARRAYS: (),
    QUANTIZED: ("offset", "group_size", "bits"),
}
"""The integers each kind carries, in :attr:`LayerState.ints` order."""


class LayoutError(TierKVError):
    """A cache this hook cannot split into blocks or snapshots (unknown class, batch > 1, padding)."""


@dataclass(frozen=True)
class LayerState:
    """One layer's cache as arrays and integers (see :data:`INT_FIELDS`), independent of the mlx-lm API."""

    kind: str
    arrays: tuple[npt.NDArray[Any], ...]
    ints: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


def kind_of(cache: Any) -> str:
    """The kind of a layer cache; :class:`LayoutError` for classes the hook does not know."""
    name = type(cache).__name__
    if name not in KINDS:
        raise LayoutError(f"mlx-lm cache class {name} is not supported (supported: {', '.join(KINDS)})")
    return name


def is_legacy(cache: Any) -> bool:
    """True for the <= 0.31 API (scalars as strings in ``meta_state``)."""
    return hasattr(type(cache), "meta_state")


def to_numpy(array: Any) -> npt.NDArray[Any]:
    """A numpy copy of an mlx array; bfloat16 (which numpy lacks) as its ``uint16`` bits."""
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    return np.array(array, copy=True)


def to_mlx(array: npt.NDArray[Any]) -> Any:
    """An mlx array from numpy; ``uint16`` arrays are bfloat16 bits (see :func:`to_numpy`)."""
    out = mx.array(array)
    return out.view(mx.bfloat16) if array.dtype == np.uint16 else out


def _from_legacy_meta(meta: Any) -> tuple[int, ...]:
    """0.31's rotating ``meta_state`` is ``(keep, max_size, offset, _idx)``; ours starts with offset."""
    keep, max_size, offset, idx = (int(x) for x in meta)
    return offset, keep, max_size, idx


def _batch_one(arrays: tuple[Any, ...], name: str) -> None:
    if any(a.shape[0] != 1 for a in arrays):
        raise LayoutError(f"{name}: only single-sequence caches (batch 1) can be stored")


def read_state(cache: Any) -> LayerState:
    """The :class:`LayerState` of one layer cache (either API); the cache must hold data."""
    kind = kind_of(cache)
    if kind == ARRAYS:
        return _read_arrays(cache)
    if cache.keys is None:
        raise LayoutError(f"{kind} is empty")
    if kind == QUANTIZED:
        return _read_quantized(cache)
    if is_legacy(cache):
        keys, values = cache.state
        ints = _from_legacy_meta(cache.meta_state) if kind == ROTATING else (keys.shape[2],)
    else:
        keys, values, *scalars = cache.state
        ints = tuple(int(x) for x in scalars)
    offset = ints[0] if kind == KV else min(ints[0], keys.shape[2])
    keys, values = keys[..., :offset, :], values[..., :offset, :]
    _batch_one((keys, values), kind)
    return LayerState(kind, (to_numpy(keys), to_numpy(values)), ints)


def _read_quantized(cache: Any) -> LayerState:
    """Six arrays cut to the offset: packed keys, key scales, key biases, then the same for values."""
    if is_legacy(cache):
        keys, values = cache.state
        _, offset, group_size, bits = (int(x) for x in cache.meta_state)
    else:
        keys, values, offset, group_size, bits = cache.state
    arrays = tuple(a[..., : int(offset), :] for a in (*keys, *values))
    _batch_one(arrays, QUANTIZED)
    return LayerState(
        QUANTIZED, tuple(to_numpy(a) for a in arrays), (int(offset), int(group_size), int(bits))
    )


def _read_arrays(cache: Any) -> LayerState:
    if getattr(cache, "left_padding", None) is not None or getattr(cache, "lengths", None) is not None:
        raise LayoutError("ArraysCache with left padding or lengths (a batch) cannot be stored")
    entries = list(cache.cache)
    if any(e is None for e in entries):
        raise LayoutError("ArraysCache is empty")
    _batch_one(tuple(entries), ARRAYS)
    return LayerState(ARRAYS, tuple(to_numpy(e) for e in entries), ())


def rebuild(template: Any, state: LayerState) -> Any:
    """A new cache of ``template``'s class (and API) holding ``state``."""
    cls = type(template)
    arrays = [to_mlx(a) for a in state.arrays]
    if state.kind == ARRAYS:
        # Through __init__: some 0.31 releases leave left_padding / lengths unset in from_state.
        cache = cls(len(arrays))
        cache.cache = arrays
        return cache
    if state.kind == QUANTIZED:
        return _rebuild_quantized(cls, arrays, state.ints, legacy=is_legacy(template))
    keys, values = arrays
    if is_legacy(template):
        meta: Any = ""
        if state.kind == ROTATING:
            offset, keep, max_size, idx = state.ints
            meta = tuple(str(i) for i in (keep, max_size, offset, idx))
        return cls.from_state((keys, values), meta)
    return cls.from_state((keys, values, *state.ints))


def _rebuild_quantized(cls: Any, arrays: list[Any], ints: tuple[int, ...], *, legacy: bool) -> Any:
    offset, group_size, bits = ints
    keys, values = tuple(arrays[:3]), tuple(arrays[3:])
    if legacy:
        step = getattr(cls, "step", 256)
        return cls.from_state((keys, values), tuple(str(i) for i in (step, offset, group_size, bits)))
    return cls.from_state((keys, values, offset, group_size, bits))


__all__ = [
    "ARRAYS",
    "INT_FIELDS",
    "KINDS",
    "KV",
    "QUANTIZED",
    "ROTATING",
    "LayerState",
    "LayoutError",
    "is_legacy",
    "kind_of",
    "read_state",
    "rebuild",
    "to_mlx",
    "to_numpy",
]
