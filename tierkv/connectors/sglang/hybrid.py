"""SGLang's ``batch_*_v2`` for hybrid models: KV pages plus the pages of state pools, per pool.

A hybrid model's host cache is a group of pools: the KV pool and, per kind of state, a sidecar pool
(Mamba / linear-attention states, sliding-window KV). Each pool is a stream of its own
(:class:`~tierkv.connectors.sglang.streams.PageStream`): Mamba states go to the ``ssm_cold`` vaults
(raw, as every state), sliding-window pages to ``kv_cold``. SGLang asks with one ``PoolTransfer`` per
pool and a hit policy:

- ``ALL_PAGES``: the pool must hold every page of the KV prefix it extends;
- ``TRAILING_PAGES``: a prefix of ``L`` pages is restorable when the pool holds the last
  ``len(transfer.keys)`` pages before ``L`` (a state is checkpointed at some page boundaries only);
- ``BLOCK_GROUPS`` (compressed-block pools) is not offered: such a pool reports no hit.

The usable prefix is the longest one every pool can restore, as SGLang's own file backend computes it;
``restorable_prefix_pages`` lists all of them (SGLang intersects the lists of its TP ranks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransferResult

from tierkv.codec import LayerGroup
from tierkv.connectors.sglang.streams import PageStream

POOL_GROUPS = {"mamba": LayerGroup.SSM, "swa": LayerGroup.SLIDING, "auxiliary_swa": LayerGroup.SLIDING}
"""The state pools tierkv stores, by SGLang's pool name, and the layer group (hence role) of each."""


def exists_v2(
    kv: PageStream, sidecars: Mapping[str, PageStream], keys: Sequence[str], transfers: Sequence[Any]
) -> Any:
    """SGLang's ``PoolTransferResult`` for ``keys`` and the pools ``transfers`` name."""
    kv_pages = kv.lookup(keys)
    hits: dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
    restorable = set(range(1, kv_pages + 1))
    for transfer in transfers:
        if not restorable:
            break
        ok = _restorable(sidecars.get(str(transfer.name)), transfer, keys[:kv_pages])
        if ok:
            hits[transfer.name] = max(ok)
        restorable &= ok
    return PoolTransferResult(max(restorable, default=0), hits, sorted(restorable))


def _restorable(stream: PageStream | None, transfer: Any, keys: Sequence[str]) -> set[int]:
    """The prefix lengths (in pages, 1..len(keys)) that ``stream`` can restore under the transfer's policy."""
    if stream is None or not keys:
        return set()
    if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
        return set(range(1, stream.lookup(keys) + 1))
    if transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
        window = max(1, len(transfer.keys or ()))
        present = stream.present(keys)
        return {n for n in range(1, len(keys) + 1) if all(present[max(0, n - window) : n])}
    return set()


def io_v2(
    streams: Mapping[str, PageStream], transfers: Sequence[Any], *, store: bool, prefix: Sequence[str] | None
) -> dict[Any, list[bool]]:
    """Load (or store) every transfer's pages; per pool, which pages arrived verified (were acknowledged).

    A transfer whose pool is not registered, or whose host indices do not cover its keys, moves nothing."""
    results: dict[Any, list[bool]] = {}
    for transfer in transfers:
        keys = list(transfer.keys or ())
        stream = streams.get(str(transfer.name))
        indices = transfer.host_indices
        size = stream.pool.page_size if stream is not None else 1
        if stream is None or indices is None or indices.numel() != len(keys) * size:
            results[transfer.name] = [False] * len(keys)
            continue
        starts = [int(i) for i in indices[::size].tolist()]
        if store:
            pages = [stream.pool.page(s) for s in starts]
            results[transfer.name] = stream.store(keys, pages, prefix[-1] if prefix else None)
        elif stream.pool.views:
            results[transfer.name] = stream.load(keys, [stream.pool.page(s) for s in starts])
        else:
            results[transfer.name] = stream.load_copied(keys, starts)
    return results


__all__ = ["POOL_GROUPS", "exists_v2", "io_v2"]
