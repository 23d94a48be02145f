"""tierkv: KV-cache tiering for LLM inference.

Evicted KV blocks go to LMDB-backed vault daemons over gRPC and come back in one batch call per vault when
the prefix returns. Import the client from here; engine hooks live in ``tierkv.connectors``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"

if TYPE_CHECKING:
    from tierkv.client.aio import AsyncVaultClient
    from tierkv.client.types import VaultStats
    from tierkv.client.vault import VaultClient

_LAZY = {
    "VaultClient": "tierkv.client.vault",
    "AsyncVaultClient": "tierkv.client.aio",
    "VaultStats": "tierkv.client.types",
}


def __getattr__(name: str) -> Any:
    """Import the client lazily so ``import tierkv`` stays cheap (the vault imports ``__version__`` only)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tierkv' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["AsyncVaultClient", "VaultClient", "VaultStats", "__version__"]
