"""The store's figures: what a Put did, the store's and each tenant's totals, usage per source class."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from tierkv.records import ClassStats, LeaseCounts, TenantStats
from tierkv.vault.entrymeta import ClassBook
from tierkv.vault.store.tenants import Tenant


@dataclasses.dataclass(frozen=True)
class PutOutcome:
    stored: int
    rejected: list[int]
    evicted: int


@dataclasses.dataclass(frozen=True)
class StoreStats:
    keys: int
    used_bytes: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int
    corrupt: int
    map_size: int
    expired: int = 0
    protected_bytes: int = 0
    protected_overflow: int = 0
    leases: LeaseCounts = LeaseCounts()


def sum_stats(picked: Sequence[Tenant], limit: int, map_size: int, leases: LeaseCounts) -> StoreStats:
    """The sum of ``picked`` tenants' figures (the caller holds the lock their writers take)."""
    return StoreStats(
        keys=sum(t.count for t in picked),
        used_bytes=sum(t.used for t in picked),
        max_bytes=limit,
        hits=sum(t.hits for t in picked),
        misses=sum(t.misses for t in picked),
        evictions=sum(t.evictions for t in picked),
        corrupt=sum(t.corrupt for t in picked),
        map_size=map_size,
        expired=sum(t.expired for t in picked),
        protected_bytes=sum(t.protected for t in picked),
        protected_overflow=sum(t.overflow for t in picked),
        leases=leases,
    )


def tenant_usage(tenants: Sequence[Tenant]) -> list[TenantStats]:
    return [
        TenantStats(t.name, t.count, t.used, t.quota, t.evictions, t.protected, t.overflow, t.expired)
        for t in tenants
    ]


def class_usage(
    tenants: Sequence[Tenant], classes: ClassBook, tenant: str | None, lock: threading.Lock
) -> list[ClassStats]:
    """Per tenant (all, or one) and source class: stored keys and bytes, lookups, 5-minute window.
    Class ``""`` holds untagged entries and misses of unknown class."""
    stored: dict[tuple[str, str], tuple[int, int, int]] = {}
    with lock:
        for t in tenants:
            if tenant is not None and t.name != tenant:
                continue
            for source in set(t.classes) | set(t.class_keys):
                label = classes.label(t.name, source)
                k, b, p = stored.get((t.name, label), (0, 0, 0))
                stored[(t.name, label)] = (
                    k + t.class_keys[source],
                    b + t.classes[source],
                    p + t.class_protected[source],
                )
            untagged = (
                t.count - sum(t.class_keys.values()),
                t.used - sum(t.classes.values()),
                t.class_protected[""],
            )
            if untagged[0] or untagged[1]:
                stored[(t.name, "")] = untagged
    return classes.usage(tenant, stored)


__all__ = ["PutOutcome", "StoreStats", "class_usage", "sum_stats", "tenant_usage"]
