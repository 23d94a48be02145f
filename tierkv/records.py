"""Records the vaults answer with that every layer reads: the client returns them, the pipeline's
:class:`~tierkv.tiering.storage.Blocks` and :class:`~tierkv.tiering.storage.Hints` declare them, and
in-process storages build them. Plain values, no imports: whoever maps them to or from protobuf does so in
one place (the client's reply parsing).

What a put stored is said as the vaults said it (:class:`PutResult`): a count here is never what was
attempted. A key is stored when a vault's reply said it stored it; a key a vault refused (the reply names
it: larger than the vault's budget or the tenant's quota, or no room the vault could make) is a
:class:`Rejection`; a vault that failed, answered what does not add up or was still busy when the put
returned stored nothing as far as the caller may know."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class HotChain:
    """One of a namespace's most-hit chains (``Hottest``): keys root first, the decayed hits of its last
    block, the class of its first, and its token ids (empty when the vault cannot replay it: a block
    stored without ids, or a prefix it does not hold)."""

    keys: tuple[bytes, ...]
    hits: float
    source: str
    tokens: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Successor:
    """A block the vault expects to be fetched next (``Successors``): its key, blob size and score (higher
    is likelier; a vault answers best first)."""

    key: bytes
    size: int
    score: float


REFUSED = "refused by the vault: larger than its budget or the tenant's quota, or no room it could make"
"""The one reason a Put reply carries for a refused key (the wire has no finer one)."""


@dataclasses.dataclass(frozen=True)
class Rejection:
    """One key one vault refused, and why (as far as the reply says)."""

    key: bytes
    vault: str
    reason: str = REFUSED


@dataclasses.dataclass(frozen=True)
class PutResult:
    """The outcome of one put over every vault it went to.

    ``stored`` keys have at least one copy a vault acknowledged; ``rejected`` keys have none, and a vault
    refused them (every refusal, of stored keys' other copies too, is in ``rejections``); the rest of
    ``sent`` (:attr:`failed`) got no usable answer in time. ``lagging`` stored keys have fewer copies than
    their owners (a replica failed, refused or was still busy when the put returned). ``unstored`` names
    the keys without any copy.
    """

    sent: int = 0
    stored: int = 0
    rejected: int = 0
    lagging: int = 0
    unstored: tuple[bytes, ...] = ()
    rejections: tuple[Rejection, ...] = ()

    @property
    def failed(self) -> int:
        """Keys no vault answered for in time (neither stored nor refused)."""
        return self.sent - self.stored - self.rejected

    @classmethod
    def every(cls, keys: int) -> PutResult:
        """All ``keys`` stored once each (a storage without replicas or refusals)."""
        return cls(sent=keys, stored=keys)


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
class TenantStats:
    """One tenant's figures on one vault (admins see every tenant's in :class:`VaultStats`)."""

    tenant: str
    keys: int
    used_bytes: int
    quota_bytes: int
    """0: no quota of its own (bounded by the vault's budget)."""
    evictions: int = 0
    protected_bytes: int = 0
    protected_overflow: int = 0
    expired: int = 0


@dataclasses.dataclass(frozen=True)
class LeaseCounts:
    """One tenant's (or every tenant's) lease figures."""

    granted: int = 0
    honoured: int = 0
    """Times an eviction walked past a leased entry."""
    expired: int = 0
    refused: int = 0
    """Leases not granted: a bound was reached or the entry was evicted while the lookup read."""
    held: int = 0
    leased_bytes: int = 0


__all__ = [
    "REFUSED",
    "ClassStats",
    "HotChain",
    "LeaseCounts",
    "PutResult",
    "Rejection",
    "Successor",
    "TenantStats",
]
