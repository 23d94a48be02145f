"""Client-side Prometheus metrics of a :class:`~tierkv.client.cluster.Cluster`, one registry per cluster."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ClusterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "tierkv_client_call_seconds",
            "Vault call latency",
            ["vault", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bytes = Counter(
            "tierkv_client_bytes", "Blob bytes moved", ["vault", "direction"], registry=self.registry
        )
        self.failures = Counter(
            "tierkv_client_failures",
            "Vault calls that failed (became misses)",
            ["vault", "method"],
            registry=self.registry,
        )
        self.refused = Counter(
            "tierkv_client_refused",
            "Vault calls the vault answered with a refusal (RESOURCE_EXHAUSTED: disk full, busy, over a "
            "limit; INVALID_ARGUMENT): misses, or blobs rejected; they leave the breaker closed",
            ["vault", "method"],
            registry=self.registry,
        )
        self.skipped = Counter(
            "tierkv_client_skipped",
            "Calls not made because the vault's breaker was open",
            ["vault"],
            registry=self.registry,
        )
        self.expired = Counter(
            "tierkv_client_expired",
            "Vault calls not made because the cluster call's deadline passed before they could start "
            "(the vault's earlier calls still held its threads): misses",
            ["vault", "method"],
            registry=self.registry,
        )
        self.breaker = Gauge(
            "tierkv_client_breaker_state", "0 closed, 1 half-open, 2 open", ["vault"], registry=self.registry
        )
        self.hedges = Counter(
            "tierkv_client_hedged_keys",
            "Keys asked of a further replica before the earlier one answered",
            ["role"],
            registry=self.registry,
        )
        self.keys = Counter(
            "tierkv_client_keys", "Keys looked up, by outcome", ["role", "outcome"], registry=self.registry
        )
        self.put_keys = Counter(
            "tierkv_client_put_keys",
            "Keys put, by what the vaults' replies said: stored, rejected (refused, stored nowhere), failed "
            "(no usable answer in time), lagging (stored, with fewer copies than owners)",
            ["role", "outcome"],
            registry=self.registry,
        )
