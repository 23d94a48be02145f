"""The vLLM worker's loads with prefetch on (``[cluster] prefetch_bytes``), against a real vault: loads run
in the worker process, so the blocks prefetched after one load serve the next without a vault fetch."""

from __future__ import annotations

import torch

from tests.conftest import VaultFactory
from tests.connectors.vllm.test_worker_logic import kv_caches, kv_view, load, make_worker, refs, store


def test_a_load_usually_following_another_is_served_from_the_prefetch_buffer(
    vault_factory: VaultFactory,
) -> None:
    caches = kv_caches()
    worker = make_worker(vault_factory().address, {0: [kv_view(caches)]}, prefetch_bytes=1 << 20)
    try:
        store(worker, "s", refs(0, [0, 1, 2, 3], [0, 1, 2, 3]))
        tier = worker._tier
        assert tier.prefetch is not None
        # the vault learns that chain 2-3 is fetched after chain 0-1 (co-access)
        for rid, positions in (("a", [0, 1]), ("b", [2, 3])):
            assert load(worker, rid, refs(0, positions, [4, 5])) == ({rid}, set())
        assert tier.prefetch.drain(10.0)
        taken = tier.prefetch.stats.hits
        assert load(worker, "c", refs(0, [0, 1], [6, 7])) == ({"c"}, set())
        assert tier.prefetch.drain(10.0)
        assert load(worker, "d", refs(0, [2, 3], [8, 9])) == ({"d"}, set())
        assert tier.prefetch.stats.hits == taken + 2  # both blocks of 2-3 came from the buffer
        totals = worker.counters.totals()  # and vLLM's stats pipeline sees it
        assert totals["prefetch_hits"] == tier.prefetch.stats.hits >= 2
        # counted at each load; the buffer may have fetched more in the background since
        assert 0 < totals["prefetch_fetched_bytes"] <= tier.prefetch.stats.fetched_bytes
        for cache in caches:
            assert torch.equal(cache[8:10], cache[2:4])  # and they are the stored blocks
    finally:
        worker.shutdown()
