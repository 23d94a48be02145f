"""The connector halves' lazily opened cluster, against a real vault process."""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

from tierkv.client.cluster import Cluster
from tierkv.connectors.vllm.lazy import LazyCluster
from tierkv.vault.launcher import VaultProcess

NAMESPACE = hashlib.sha256(b"lazy-cluster").digest()
KEY = hashlib.sha256(b"block-0").digest()


def test_concurrent_first_uses_share_one_cluster_and_close_reopens(vault: VaultProcess) -> None:
    made: list[Cluster] = []

    def factory() -> Cluster:
        cluster = Cluster({"kv_cold": vault.address}, timeout=2.0)
        made.append(cluster)
        return cluster

    lazy = LazyCluster(factory)
    assert made == [], "nothing is opened before the first use"
    start = threading.Barrier(8)

    def first_use(_: int) -> Cluster:
        start.wait()
        return lazy.get()

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(first_use, range(8)))
    assert len(made) == 1 and all(c is made[0] for c in got)
    assert got[0].put(NAMESPACE, {KEY: b"payload"}) == 1

    lazy.close()
    lazy.close()  # a second close is a no-op
    reopened = lazy.get()
    assert len(made) == 2 and reopened is made[1]
    assert reopened.get(NAMESPACE, [KEY]) == [b"payload"]
    lazy.close()
