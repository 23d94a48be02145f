"""Prometheus metrics. Each server or cluster owns its own registry, so several can live in one process.

Hit rate is not exported as a gauge (it would lie after a restart): derive it from the counters, e.g.
``rate(tierkv_vault_hits_total[5m])`` over the sum of the hits and misses rates — per source class and
tenant from ``tierkv_vault_class_hits_total`` and ``tierkv_vault_class_misses_total`` alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tierkv.records import ClassStats, TenantStats
from tierkv.vault.store import StoreStats

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SIZE_BUCKETS = tuple(float(4**i * 1024) for i in range(0, 12))


Family = CounterMetricFamily | GaugeMetricFamily


class _StoreCollector(Collector):
    """Reads the store's own counters at scrape time, so nothing is counted twice."""

    def __init__(
        self,
        stats: Callable[[], StoreStats],
        tenants: Callable[[], list[TenantStats]] | None = None,
        classes: Callable[[], list[ClassStats]] | None = None,
    ) -> None:
        self._stats = stats
        self._tenants = tenants
        self._classes = classes

    def collect(self) -> Iterator[Family]:
        yield from self._store()
        if self._tenants is not None:
            yield from _tenant_families(self._tenants())
        if self._classes is not None:
            yield from _class_families(self._classes())

    def _store(self) -> Iterator[Family]:
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
        yield CounterMetricFamily(
            "tierkv_vault_expired", "Lookups of entries past their time to live", value=s.expired
        )
        for name, help_text in (
            ("granted", "Lookup leases granted"),
            ("honoured", "Evictions that walked past a leased entry"),
            ("expired", "Lookup leases that ended unread"),
            ("refused", "Lookup leases refused (a bound was reached)"),
        ):
            yield CounterMetricFamily(f"tierkv_vault_leases_{name}", help_text, value=getattr(s.leases, name))
        yield GaugeMetricFamily(
            "tierkv_vault_leased_bytes", "Bytes under lookup leases", value=s.leases.leased_bytes
        )


def _tenant_families(usage: list[TenantStats]) -> Iterator[Family]:
    protected = GaugeMetricFamily(
        "tierkv_vault_protected_bytes", "Bytes stored as protected", labels=["tenant"]
    )
    overflow = CounterMetricFamily(
        "tierkv_vault_protected_overflow",
        "Protected stores past the tenant's protected cap, kept unprotected",
        labels=["tenant"],
    )
    for u in usage:
        protected.add_metric([u.tenant], u.protected_bytes)
        overflow.add_metric([u.tenant], u.protected_overflow)
    yield protected
    yield overflow


def _class_families(usage: list[ClassStats]) -> Iterator[Family]:
    labels = ["tenant", "source"]
    families: dict[str, Family] = {
        "hits": CounterMetricFamily("tierkv_vault_class_hits", "Blobs found, by source class", labels=labels),
        "misses": CounterMetricFamily(
            "tierkv_vault_class_misses",
            "Lookups missed, by the class of the evicted or expired entry ('' when unknown)",
            labels=labels,
        ),
        "expired": CounterMetricFamily(
            "tierkv_vault_class_expired", "Lookups of expired entries, by source class", labels=labels
        ),
        "bytes": GaugeMetricFamily(
            "tierkv_vault_class_bytes", "Bytes stored, by source class", labels=labels
        ),
        "keys": GaugeMetricFamily(
            "tierkv_vault_class_keys", "Entries stored, by source class", labels=labels
        ),
    }
    for c in usage:
        for field, family in families.items():
            family.add_metric([c.tenant, c.source], getattr(c, field))
    yield from families.values()


class VaultMetrics:
    """Request-level metrics of one vault; store-level figures are read from the store when scraped."""

    def __init__(
        self,
        stats: Callable[[], StoreStats],
        *,
        role: str = "",
        version: str = "",
        tenants: Callable[[], list[TenantStats]] | None = None,
        classes: Callable[[], list[ClassStats]] | None = None,
    ) -> None:
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
        self.registry.register(_StoreCollector(stats, tenants, classes))

    def serve_http(self, host: str, port: int) -> None:
        """Expose /metrics on ``host:port`` from a daemon thread."""
        start_http_server(port, addr=host, registry=self.registry)
