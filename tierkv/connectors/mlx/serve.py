"""``python -m tierkv.connectors.mlx.serve``: mlx-lm's OpenAI server with the tiered prompt cache.

::

    python -m tierkv.connectors.mlx.serve --tierkv-config tierkv.toml [--tierkv-block-size 16] \\
        --model mlx-community/... --port 8080 --prompt-cache-size 4   # and any other mlx_lm.server flag

The ``--tierkv-*`` flags are taken here; everything else goes to ``mlx_lm.server`` unchanged. The server
module builds its prompt cache as ``LRUPromptCache(size)`` and its model holder as
``ModelProvider(args)``; this launcher points those two names, in that module only and in this process
only, at a :class:`~tierkv.connectors.mlx.server.TieredPromptCache` and a provider that builds an
:class:`~tierkv.connectors.mlx.hook.MlxTier` for each model it loads (none with a draft model: its
caches hold the draft model's layers too). The vaults are opened on first use.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import mlx_lm.server as mlx_server

from tierkv.connectors.launcher_flags import launcher_parser, parse_launcher_args
from tierkv.connectors.mlx.hook import MlxTier
from tierkv.connectors.mlx.server import TieredPromptCache
from tierkv.tiering.storage import LazyStorage, Storage, open_cluster

log = logging.getLogger(__name__)


def install(
    storage: Storage, *, block_size: int = 16, codec: str = "raw", tenant: str = ""
) -> dict[Any, MlxTier]:
    """Point ``mlx_lm.server``'s prompt cache and model provider at tiered ones; returns the tiers by key."""
    tiers: dict[Any, MlxTier] = {}
    base = mlx_server.ModelProvider

    class TieredModelProvider(base):  # type: ignore[misc, valid-type]
        def _load(self, *args: Any, **kwargs: Any) -> Any:
            result = super()._load(*args, **kwargs)
            if self.draft_model is None and self.model_key not in tiers:
                model_id = str(self.model_key[0]) + (f"+{self.model_key[1]}" if self.model_key[1] else "")
                tiers[self.model_key] = MlxTier(
                    self.model, storage, model_id=model_id, block_size=block_size, codec=codec, tenant=tenant
                )
            return result

    def prompt_cache(max_size: int = 10, max_bytes: int = 1 << 63) -> TieredPromptCache:
        return TieredPromptCache(tiers.get, max_size=max_size, max_bytes=max_bytes)

    mlx_server.ModelProvider = TieredModelProvider
    mlx_server.LRUPromptCache = prompt_cache
    return tiers


def main(argv: Sequence[str] | None = None) -> None:
    ours, rest, config = parse_launcher_args(launcher_parser(codec=True), argv, "mlx_lm.server")
    storage = LazyStorage(lambda: open_cluster(config))
    install(storage, block_size=ours.tierkv_block_size, codec=ours.tierkv_codec, tenant=ours.tierkv_tenant)
    sys.argv = ["mlx_lm.server", *rest]
    try:
        mlx_server.main()
    finally:
        storage.close()


if __name__ == "__main__":
    main()
