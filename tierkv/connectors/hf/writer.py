"""Store-on-evict: when the hot tier drops an entry, its full blocks and snapshots go to the vaults.

The hot tier calls :meth:`EvictWriter.on_evict` on the serving thread; the store itself runs on a
:class:`~tierkv.tiering.BoundedWorker` (one thread, bounded in-flight entries, back-pressure beyond
that). Only what the vaults lack is shipped: blocks past the entry's ``cold_blocks`` and snapshots at
block boundaries not in ``cold_states``. An entry whose request came with a layout ships each block
with its retention metadata (parent = the block before it in its chain); a state snapshot takes the
metadata of the block it ends.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import torch

from tierkv.connectors.hf.blocks import ModelBlocks
from tierkv.connectors.hf.hot import HotEntry, TokenArray
from tierkv.connectors.hf.payload import HotPayload
from tierkv.connectors.hf.streams import Streams
from tierkv.retention import UNTAGGED, BlockMeta, keyed
from tierkv.tiering import BoundedWorker, ColdTier, StoreTally, full_blocks


class EvictWriter:
    """Ships evicted hot entries through the pipeline, in the background."""

    def __init__(
        self,
        tier: ColdTier[torch.Tensor] | None,
        streams: Streams,
        blocks: ModelBlocks,
        max_inflight: int,
    ) -> None:
        self.tier = tier
        self.streams = streams
        self.blocks = blocks
        self.block_size = blocks.block_size
        self.tally = StoreTally()
        self._lock = threading.Lock()
        self._worker = BoundedWorker(max_inflight, name="tierkv-hf-store")

    @property
    def stored_blobs(self) -> int:
        """Blobs the vaults' replies said they stored, so far (``tally.rejected``: refused ones)."""
        return self.tally.stored

    @property
    def stored_bytes(self) -> int:
        """Bytes of the acknowledged blobs so far."""
        return self.tally.stored_bytes

    def on_evict(self, entry: HotEntry[HotPayload]) -> None:
        if self.tier is not None:
            self._worker.submit(functools.partial(self.store, self.tier, entry.tokens, entry.payload))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the stores submitted so far; False if ``timeout`` passed first."""
        return self._worker.drain(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new stores and wait for the pending ones."""
        return self._worker.close(timeout)

    def store(self, tier: ColdTier[torch.Tensor], tokens: TokenArray, payload: HotPayload) -> None:
        """Ship an entry's full blocks (and block-boundary snapshots) the vaults lack."""
        bs = self.block_size
        n_blocks = full_blocks(len(tokens), bs)
        if self.blocks.layout.has_kv and n_blocks > payload.cold_blocks:
            keys = self.streams.kv_keys(tokens, n_blocks)
            kv = payload.kv
            blocks = (
                (keys[i], self.blocks.kv_block(kv, i), bs) for i in range(payload.cold_blocks, n_blocks)
            )
            self._count(tier.store(self.streams.kv, blocks, _tags(payload.meta, keys)))
        positions = sorted(
            p
            for p in payload.states
            if p % bs == 0 and 0 < p <= n_blocks * bs and p not in payload.cold_states
        )
        if not positions:
            return
        group_keys = self.streams.state_keys(tokens, positions[-1] // bs)
        arrays = {p: self.blocks.state_arrays(payload.states[p]) for p in positions}
        for group in self.streams.state_groups:
            states = ((group_keys[group][p // bs - 1], arrays[p][group], p) for p in positions)
            tags = _tags(payload.meta, group_keys[group])
            self._count(tier.store(self.streams.state.sibling(group), states, tags))

    def _count(self, tally: StoreTally) -> None:
        with self._lock:
            self.tally.add(tally)


def _tags(meta: list[BlockMeta] | None, keys: Sequence[bytes]) -> dict[bytes, BlockMeta] | None:
    """Block ``i`` of the chain ``keys`` with ``meta[i]`` (untagged past its end); None without a layout."""
    if meta is None:
        return None
    return keyed([*meta[: len(keys)], *[UNTAGGED] * (len(keys) - len(meta))], keys)


__all__ = ["EvictWriter"]
