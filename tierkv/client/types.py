"""Typed answers of the vault client."""

from __future__ import annotations

import dataclasses


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

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups since start; None before the first BatchGet."""
        total = self.hits + self.misses
        return self.hits / total if total else None
