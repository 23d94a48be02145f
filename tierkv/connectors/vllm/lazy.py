"""The vault cluster of one connector half, opened on first use and closed once.

The worker half must not open gRPC channels before vLLM has forked its worker process, and the
scheduler's lookup threads may all ask for the cluster at the same moment; both halves need exactly one
cluster, created by whichever caller comes first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tierkv.client.cluster import Cluster


class LazyCluster:
    """Creates the cluster from ``factory`` on the first :meth:`get`; :meth:`close` closes it once."""

    def __init__(self, factory: Callable[[], Cluster]) -> None:
        self._factory = factory
        self._cluster: Cluster | None = None
        self._lock = threading.Lock()

    def get(self) -> Cluster:
        with self._lock:
            if self._cluster is None:
                self._cluster = self._factory()
            return self._cluster

    def close(self) -> None:
        with self._lock:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None


__all__ = ["LazyCluster"]
