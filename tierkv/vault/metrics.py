"""Prometheus metrics. Each server or cluster owns its own registry, so several can live in one process.

Hit rate is not exported as a gauge (it would lie after a restart): derive it from the counters, e.g.
``rate(tierkv_vault_hits_total[5m])`` over the sum of the hits and misses rates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tierkv.vault.store import StoreStats

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SIZE_BUCKETS = tuple(float(4**i * 1024) for i in range(0, 12))


class _StoreCollector(Collector):
    """Reads the store's own counters at scrape time, so nothing is counted twice."""

    def __init__(self, stats: Callable[[], StoreStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._stats()
        yield CounterMetricFamily("tierkv_vault_hits", "Blobs found by BatchGet", value=s.hits)
        yield CounterMetricFamily(
            "tierkv_vault_misses", "Keys missing or corrupt in BatchGet", value=s.misses
        )
        yield CounterMetricFamily(
            "tierkv_vault_evictions", "Entries evicted to stay in budget", value=s.evictions
        )
        yield CounterMetricFamily(
            "tierkv_vault_corrupt", "Entries whose checksum failed on read", value=s.corrupt
        )
        yield GaugeMetricFamily(
            "tierkv_vault_used_bytes", "Bytes charged against the budget", value=s.used_bytes
        )
        yield GaugeMetricFamily("tierkv_vault_max_bytes", "The byte budget", value=s.max_bytes)
        yield GaugeMetricFamily("tierkv_vault_keys", "Entries stored", value=s.keys)
        yield GaugeMetricFamily("tierkv_vault_map_bytes", "LMDB map size", value=s.map_size)


class VaultMetrics:
    """Request-level metrics of one vault; store-level figures are read from the store when scraped."""

    def __init__(self, stats: Callable[[], StoreStats], *, role: str = "", version: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.build = Info("tierkv_vault_build", "Version and role of this vault", registry=self.registry)
        self.build.info({"version": version, "role": role})
        self.requests = Counter(
            "tierkv_vault_requests", "RPCs handled", ["method", "code"], registry=self.registry
        )
        self.latency = Histogram(
            "tierkv_vault_request_seconds",
            "RPC latency",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bytes_in = Counter("tierkv_vault_bytes_in", "Blob bytes received by Put", registry=self.registry)
        self.bytes_out = Counter(
            "tierkv_vault_bytes_out", "Blob bytes sent by BatchGet", registry=self.registry
        )
        self.batch_bytes = Histogram(
            "tierkv_vault_batch_bytes",
            "Blob bytes per Put or BatchGet call",
            ["method"],
            buckets=_SIZE_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StoreCollector(stats))

    def serve_http(self, host: str, port: int) -> None:
        """Expose /metrics on ``host:port`` from a daemon thread."""
        start_http_server(port, addr=host, registry=self.registry)
