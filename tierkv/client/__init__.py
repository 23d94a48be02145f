"""Clients of the vault: one vault (sync and asyncio) and a cluster of vaults by role."""

from tierkv.client.aio import AsyncVaultClient
from tierkv.client.types import VaultStats
from tierkv.client.vault import VaultClient

__all__ = ["AsyncVaultClient", "VaultClient", "VaultStats"]
