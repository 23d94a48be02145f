"""Typed answers of the vault client."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ClassStats:
    """One source class of one tenant on one vault (``source`` "" = untagged blocks and misses of unknown
    class). Counters run since the vault started; ``*_5m`` cover the last five minutes."""

    tenant: str
    source: str
    keys: int
    bytes: int
    hits: int
    misses: int
    expired: int
    hits_5m: int
    lookups_5m: int
    protected_bytes: int = 0

    @property
    def hit_rate_5m(self) -> float | None:
        """Hits over lookups in the last five minutes; None without lookups."""
        return self.hits_5m / self.lookups_5m if self.lookups_5m else None


@dataclasses.dataclass(frozen=True)
class VaultStats:
    """What a vault says about itself (``Stats`` RPC). Counters run since the vault process started."""

    version: str
    role: str
    keys: int
    used_bytes: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int
    corrupt: int
    bytes_in: int
    bytes_out: int
    uptime_s: float
    sync_mode: str
    policy: str
    path: str
    bulk_port: int = 0
    expired: int = 0
    protected_bytes: int = 0
    protected_overflow: int = 0
    classes: tuple[ClassStats, ...] = ()
    """Per tenant and source class (the caller's tenant; an admin sees every tenant's)."""

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups since start; None before the first BatchGet."""
        total = self.hits + self.misses
        return self.hits / total if total else None
