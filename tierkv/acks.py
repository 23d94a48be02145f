"""What a put stored, as the vaults said it: the answer every storage gives the pipeline and the hooks.

A count here is never what was attempted. A key is stored when a vault's reply said it stored it; a key a
vault refused (the reply names it: larger than the vault's budget or the tenant's quota, or no room the
vault could make) is a :class:`Rejection`; a vault that failed, answered what does not add up or was still
busy when the put returned stored nothing as far as the caller may know.
"""

from __future__ import annotations

import dataclasses

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


__all__ = ["REFUSED", "PutResult", "Rejection"]
