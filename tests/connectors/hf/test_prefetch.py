"""TieredSession with prefetch on, against a real vault: a prompt usually asked after another is
restored from the prefetch buffer (no vault round trip for its blocks), with the same output."""

from __future__ import annotations

import torch

from tests.conftest import VaultFactory
from tests.connectors.hf.models import prompt, reference, tiny_model
from tierkv.client.cluster import Cluster
from tierkv.connectors.hf import TieredSession

NEW = 8


def test_a_prompt_that_usually_follows_is_restored_from_the_prefetch_buffer(
    vault_factory: VaultFactory,
) -> None:
    model = tiny_model("llama")
    first, then = prompt(50, seed=1), prompt(50, seed=2)
    with Cluster({"kv_cold": [vault_factory().address]}, timeout=10.0) as cluster:
        writer = TieredSession(model, cluster, block_size=16)
        for ids in (first, then):
            writer.generate(ids, max_new_tokens=NEW)
        assert writer.persist(timeout=30)
        teacher = TieredSession(model, cluster, block_size=16)  # the vault learns: `then` follows `first`
        for ids in (first, then):
            teacher.generate(ids, max_new_tokens=NEW)
            assert teacher.last_stats.source == "cold"

        reader = TieredSession(model, cluster, block_size=16, prefetch_bytes=8 << 20)
        tier = reader.restorer.tier
        assert tier is not None and tier.prefetch is not None
        reader.generate(first, max_new_tokens=NEW)
        assert tier.prefetch.drain(30.0) and tier.prefetch.stats.fetched == 3
        hits_before = sum(st.hits for _, _, st in cluster.stats() if not isinstance(st, Exception))
        out = reader.generate(then, max_new_tokens=NEW)
        assert torch.equal(out, reference(model, then, NEW))
        assert reader.last_stats.source == "cold" and reader.last_stats.restored_tokens == 48
        assert tier.prefetch.stats.hits == 3
        assert tier.prefetch.drain(30.0)
        hits_after = sum(st.hits for _, _, st in cluster.stats() if not isinstance(st, Exception))
        # the vault served only the next prefetch (`first` follows `then` too), nothing for the restore
        assert hits_after - hits_before == tier.prefetch.stats.fetched - 3
        tier.close()
