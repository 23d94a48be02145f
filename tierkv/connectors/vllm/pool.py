"""The part of vLLM's GPU ``BlockPool`` the scheduler side touches, as typed Protocols.

Two features hold references on cached GPU blocks through the pool the connector is bound to
(``bind_gpu_block_pool``): :mod:`.protect` keeps protected prefixes out of eviction and :mod:`.eviction`
keeps a block alive while it is being shipped. Both read the same few fields, written down once here so
a vLLM change that breaks them breaks type checks in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol


class Block(Protocol):
    """The fields of vLLM's ``KVCacheBlock`` tierkv reads."""

    block_id: int
    ref_cnt: int
    is_null: bool

    @property
    def block_hash(self) -> Any: ...


class FreeQueue(Protocol):
    """vLLM's ``FreeKVCacheBlockQueue``: a doubly linked list between two sentinel blocks."""

    num_free_blocks: int
    fake_free_list_head: Any
    fake_free_list_tail: Any

    def iter_blocks_after(self, cursor: Any) -> Iterator[Any]: ...


class Pool(Protocol):
    """The part of vLLM's GPU ``BlockPool`` tierkv uses."""

    num_gpu_blocks: int
    blocks: Sequence[Block]
    free_block_queue: FreeQueue
    cached_block_hash_to_block: Any

    def touch(self, blocks: Sequence[Any]) -> None: ...

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None: ...

    def get_num_free_blocks(self) -> int: ...

    def reset_prefix_cache(self) -> bool: ...


def guard_reset(pool: Pool, *guards: Callable[[], bool]) -> None:
    """Wrap the pool's ``reset_prefix_cache`` once for everything holding references in it: the guards
    run in order before the reset, and the first that answers False refuses it (later ones do not run,
    so put a guard that may refuse before one that lets go of its references)."""
    reset = pool.reset_prefix_cache

    def reset_prefix_cache() -> bool:
        return all(guard() for guard in guards) and reset()

    pool.reset_prefix_cache = reset_prefix_cache  # type: ignore[method-assign]


__all__ = ["Block", "FreeQueue", "Pool", "guard_reset"]
