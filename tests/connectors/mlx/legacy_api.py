"""Hand-written stand-ins for mlx-lm 0.31's cache classes (the API EXO's fork pins), for the codec tests.

Only what the hook touches, written from 0.31's documented behaviour: ``state`` holds the arrays cut to
``offset``, scalars are strings in ``meta_state``, ``from_state(state, meta_state)`` builds without
``__init__`` and a ``KVCache`` derives its offset from the keys. Class names match mlx-lm's, because
the hook tells caches apart by class name.
"""

from __future__ import annotations

from typing import Any


class _Base:
    @property
    def meta_state(self) -> Any:
        return ""

    @meta_state.setter
    def meta_state(self, v: Any) -> None:
        if v:
            raise ValueError("this cache has no meta_state")

    @classmethod
    def from_state(cls, state: Any, meta_state: Any) -> Any:
        obj = cls.__new__(cls)
        obj.state = state
        obj.meta_state = meta_state
        return obj


class KVCache(_Base):
    def __init__(self) -> None:
        self.keys: Any = None
        self.values: Any = None
        self.offset = 0

    @property
    def state(self) -> Any:
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    @state.setter
    def state(self, v: Any) -> None:
        self.keys, self.values = v
        self.offset = self.keys.shape[2]


class RotatingKVCache(_Base):
    def __init__(self, max_size: int, keep: int = 0) -> None:
        self.keys: Any = None
        self.values: Any = None
        self.offset = 0
        self.keep = keep
        self.max_size = max_size
        self._idx = 0

    @property
    def state(self) -> Any:
        if self.offset < self.keys.shape[2]:
            return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]
        return self.keys, self.values

    @state.setter
    def state(self, v: Any) -> None:
        self.keys, self.values = v

    @property
    def meta_state(self) -> Any:
        return tuple(map(str, (self.keep, self.max_size, self.offset, self._idx)))

    @meta_state.setter
    def meta_state(self, v: Any) -> None:
        self.keep, self.max_size, self.offset, self._idx = map(int, v)


class QuantizedKVCache(_Base):
    step = 256

    def __init__(self, group_size: int = 64, bits: int = 8) -> None:
        self.keys: Any = None
        self.values: Any = None
        self.offset = 0
        self.group_size = group_size
        self.bits = bits

    @property
    def state(self) -> Any:
        cut = (
            tuple(a[..., : self.offset, :] for a in self.keys),
            tuple(a[..., : self.offset, :] for a in self.values),
        )
        return cut

    @state.setter
    def state(self, v: Any) -> None:
        self.keys, self.values = v

    @property
    def meta_state(self) -> Any:
        return tuple(map(str, (self.step, self.offset, self.group_size, self.bits)))

    @meta_state.setter
    def meta_state(self, v: Any) -> None:
        self.step, self.offset, self.group_size, self.bits = map(int, v)


class ArraysCache(_Base):
    def __init__(self, size: int) -> None:
        self.cache: list[Any] = [None] * size
        self.left_padding = None
        self.lengths = None

    @property
    def state(self) -> Any:
        return self.cache

    @state.setter
    def state(self, v: Any) -> None:
        self.cache = v


def from_current(cache: Any) -> Any:
    """The 0.31 twin of a filled 0.32 layer cache (same arrays and scalars)."""
    name = type(cache).__name__
    if name == "ArraysCache":
        twin = ArraysCache(len(cache.cache))
        twin.cache = list(cache.cache)
        return twin
    if name == "QuantizedKVCache":
        q = QuantizedKVCache(cache.group_size, cache.bits)
        q.keys, q.values, q.offset = cache.keys, cache.values, cache.offset
        return q
    if name == "RotatingKVCache":
        rot = RotatingKVCache(cache.max_size, cache.keep)
        rot.keys, rot.values, rot.offset, rot._idx = cache.keys, cache.values, cache.offset, cache._idx
        return rot
    kv = KVCache()
    kv.keys, kv.values, kv.offset = cache.keys, cache.values, cache.offset
    return kv
