"""One host pool's pages in one namespace: look them up, load them into page views, store them.

The KV pool has one stream; a hybrid model's state pools (SGLang's ``batch_*_v2``) one each, in the role
their layer group names (Mamba states: ``ssm_cold``). Every load and store goes through the shared
pipeline; a vault failure is a miss, and nothing is written into the pool that did not verify.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from tierkv.codec import LayerGroup
from tierkv.connectors.sglang.pages import PagePool, byte_rows, page_keys
from tierkv.connectors.sglang.stats import PageStats
from tierkv.errors import TierKVError
from tierkv.keys import Namespace
from tierkv.retention import UNTAGGED, keyed
from tierkv.tiering import ColdTier, NumpyArrays, Restored, Storage, StreamSpec
from tierkv.tiering.tensors import TorchArrays

logger = logging.getLogger(__name__)


class PageStream:
    """The pages of ``pool`` in ``namespace``, in ``storage``; counts go to ``stats``.

    Pages of bytes (``uint8``: a Mamba state page holds several dtypes) go through numpy, the codec's
    route for opaque bytes; the rest through torch."""

    def __init__(
        self,
        storage: Storage,
        pool: PagePool,
        namespace: Namespace,
        layer_group: LayerGroup,
        stats: PageStats,
        lease_ms: int,
    ) -> None:
        self.pool, self.namespace, self.stats = pool, namespace, stats
        self.bytes = pool.dtype == "uint8"
        self.tier: ColdTier[Any] = ColdTier(storage, NumpyArrays() if self.bytes else TorchArrays())
        self.spec = StreamSpec(namespace.digest, layer_group, namespace.codec)
        self.lease_ms = lease_ms

    def _array(self, page: torch.Tensor) -> Any:
        return page.numpy() if self.bytes else page

    def keys(self, keys: Sequence[str]) -> list[bytes]:
        return page_keys(self.namespace, keys)

    def lookup(self, keys: Sequence[str]) -> int:
        """How many leading ``keys`` the vaults hold (leased)."""
        return self.tier.lookup(self.spec, self.keys(keys), lease_ms=self.lease_ms)

    def present(self, keys: Sequence[str]) -> list[bool]:
        """Which of ``keys`` the vaults hold, by leading runs: one lookup per missing key, plus one."""
        found = [False] * len(keys)
        start = 0
        while start < len(keys):
            run = self.lookup(keys[start:])
            found[start : start + run] = [True] * run
            start += run + 1
        return found

    def load(self, keys: Sequence[str], pages: Sequence[torch.Tensor]) -> list[bool]:
        """One restore of ``keys`` into ``pages`` (page-shaped views); which pages arrived verified."""
        pool, spec = self.pool, self.spec
        expect = spec.expect(pool.shape, pool.page_size, pool.dtype)
        start = time.perf_counter()
        try:
            if spec.codec == "raw":
                result = self.tier.restore(
                    spec, self.keys(keys), expect, place=_placer(pages), rows=lambda i: byte_rows(pages[i])
                )
            else:
                result = self.tier.restore(
                    spec, self.keys(keys), expect, lambda n: self._array(pages[n]), leading_only=True
                )
        except TierKVError:
            logger.exception("tierkv: loading %d pages failed; they are misses", len(keys))
            result = Restored(len(keys))
        missed = result.asked - len(result.decoded) - result.rejected
        self.stats.loaded(
            len(result.decoded),
            missed,
            result.rejected,
            result.landed,
            result.decoded_bytes,
            time.perf_counter() - start,
        )
        good = set(result.decoded)
        return [i in good for i in range(len(keys))]

    def load_copied(self, keys: Sequence[str], starts: Sequence[int]) -> list[bool]:
        """:meth:`load` for a pool whose pages are copies, not views (Mamba states): into flat pages
        first, then into the pool with its own ``set_from_flat_data_page``."""
        host = self.pool.host
        flat = [host.get_dummy_flat_data_page() for _ in keys]
        got = self.load(keys, [f.view(self.pool.shape) for f in flat])
        for ok, start, page in zip(got, starts, flat, strict=True):
            if ok:
                host.set_from_flat_data_page(start, page)
        return got

    def store(self, keys: Sequence[str], pages: Sequence[torch.Tensor], parent: str | None) -> list[bool]:
        """Store ``pages`` under ``keys`` (a chain after ``parent``); which a vault acknowledged."""
        wrapped = self.keys(keys)
        meta = keyed([UNTAGGED] * len(wrapped), wrapped, self.keys([parent])[0] if parent else b"")
        start = time.perf_counter()
        blocks = ((k, self._array(p), self.pool.page_size) for k, p in zip(wrapped, pages, strict=True))
        try:
            tally = self.tier.store(self.spec, blocks, meta)
        except TierKVError:
            logger.exception("tierkv: storing %d pages failed", len(keys))
            return [False] * len(keys)
        acked = set(tally.acked)
        self.stats.stored(len(acked), len(keys) - len(acked), tally.stored_bytes, time.perf_counter() - start)
        return [k in acked for k in wrapped]


def _placer(pages: Sequence[torch.Tensor]) -> Callable[[int, Any], None]:
    """``place`` for a restore: copy a verified page's values into its view (the one copy)."""

    def place(i: int, values: Any) -> None:
        if isinstance(values, np.ndarray):  # a byte page, viewed by numpy
            np.copyto(pages[i].numpy(), values)
        else:
            pages[i].copy_(values)

    return place


__all__ = ["PageStream"]
