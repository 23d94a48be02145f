"""Typed answers of the vault client."""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

from tierkv.records import ClassStats, LeaseCounts, TenantStats

if TYPE_CHECKING:
    from tierkv.codec.header import BlobHeader


@dataclasses.dataclass(frozen=True)
class PutAck:
    """One vault's checked answer to a put: the positions (in the items as given) it stored and those it
    refused. A reply that does not add up is an error, never an answer (``_rpc.refused``)."""

    stored: tuple[int, ...]
    rejected: tuple[int, ...]
    reasons: tuple[str, ...] = ()
    """Why the vault refused each of ``rejected``, in order (empty: the reply's positions only said
    refused); a whole Put refused with RESOURCE_EXHAUSTED (its disk full, its in-flight bytes used up)
    carries the vault's words."""


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
    bulk_put: bool = False
    """Whether the bulk port also takes Put (vaults that predate bulk Put say no)."""
    bulk_lookup: bool = False
    """Whether the bulk port also answers PrefixLookup (vaults that predate it say no)."""
    expired: int = 0
    protected_bytes: int = 0
    protected_overflow: int = 0
    classes: tuple[ClassStats, ...] = ()
    """Per tenant and source class (the caller's tenant; an admin sees every tenant's)."""
    tenant: str = ""
    """The caller's tenant: ``keys``, ``used_bytes`` and ``max_bytes`` are its own unless it is an admin."""
    access: str = ""
    """The caller's access role, ``admin`` or ``user`` (empty from a vault that predates tenancy)."""
    tenants: tuple[TenantStats, ...] = ()
    """Every tenant's figures (admin callers only)."""
    leases: LeaseCounts = LeaseCounts()
    """The caller's tenant's lookup leases (an admin's: every tenant's); the vault's own record type."""

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups since start; None before the first BatchGet."""
        total = self.hits + self.misses
        return self.hits / total if total else None


def blob_header(head: bytes) -> BlobHeader:
    """The tierkv blob header at the start of ``head`` (codec, dtype, shape, tokens, layer group);
    :class:`~tierkv.errors.CodecError` when the bytes are no tierkv blob (or from a newer writer)."""
    from tierkv.codec.header import read_header

    return read_header(head, partial=True)


@dataclasses.dataclass(frozen=True)
class NamespaceInfo:
    """One namespace of one tenant on one vault (``ListNamespaces``). The namespace is a digest: the vault
    cannot say which model it belongs to; :attr:`head`, the start of a sample blob, says what it holds."""

    tenant: str
    namespace: bytes
    keys: int
    used_bytes: int
    protected_bytes: int
    sample_key: bytes
    head: bytes


class EntryStatus(str, enum.Enum):
    FOUND = "found"
    MISSING = "missing"
    CORRUPT = "corrupt"
    """Stored, but the bytes fail their checksum (a read drops the entry)."""


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """One stored entry as the vault keeps it (``Inspect``): read without counting a hit.

    ``has_meta`` says whether the entry has a retention record; the fields after it are that record
    (``expiry`` in Unix seconds, 0 = never; ``hits`` decayed, reads not yet written included;
    ``children`` the stored blocks that continue it)."""

    status: EntryStatus
    tenant: str
    size: int
    charge: int
    priority: int
    head: bytes
    has_meta: bool = False
    source: str = ""
    importance: float = 0.0
    protected: bool = False
    expiry: float = 0.0
    expired: bool = False
    hits: float = 0.0
    children: int = 0
    parent: bytes = b""

    @property
    def found(self) -> bool:
        return self.status is EntryStatus.FOUND
