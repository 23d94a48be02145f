"""``tierkv llama-serve``: llama-cpp-python's OpenAI-compatible server with the tiered cache.

::

    tierkv llama-serve --model model.gguf --n_ctx 8192 --flash_attn true --port 8000 \\
        [--tierkv-config tierkv.toml] [--tierkv-block-size 16] [--tierkv-tenant NAME]

The ``--tierkv-*`` flags are taken here; every other flag goes to ``llama_cpp.server`` unchanged
(``--model``, ``--host``, ``--port``, ``--n_ctx``, ``--type_k`` …, or ``--config_file``). Each model the
server loads gets a :class:`~tierkv.connectors.llamacpp.hook.LlamaTier` as its ``Llama`` cache, in place
of llama-cpp-python's own ``--cache`` (RAM or disk): prompts are restored from the vaults and their
blocks stored after each completion. A model the hook cannot tier (sliding-window, recurrent …) is
served untiered, with a warning. The vaults are opened on first use; queued stores are shipped when the
server stops.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from llama_cpp.server import __main__ as server_main
from llama_cpp.server.model import LlamaProxy

from tierkv.connectors.launcher_flags import launcher_parser, parse_launcher_args
from tierkv.connectors.llamacpp.hook import LlamaTier
from tierkv.errors import UnsupportedStateError
from tierkv.tiering.storage import LazyStorage, Storage, open_cluster

log = logging.getLogger(__name__)


def install(storage: Storage, *, block_size: int = 16, tenant: str = "") -> list[LlamaTier]:
    """Give every model ``llama_cpp.server`` loads a tier as its cache; returns the tiers made so far."""
    tiers: list[LlamaTier] = []
    load: Callable[[Any], Any] = LlamaProxy.load_llama_from_model_settings

    def tiered(settings: Any) -> Any:
        llm = load(settings)
        if settings.cache:
            log.warning("--cache %s replaced by the tierkv cache", settings.cache_type)
        try:
            tier = LlamaTier(llm, storage, block_size=block_size, tenant=tenant)
        except UnsupportedStateError as exc:
            log.warning("serving %s without tiering: %s", settings.model, exc)
            return llm
        llm.set_cache(tier.cache())
        tiers.append(tier)
        log.info("tierkv: %s tiered, %d-token blocks, %s", settings.model, block_size, tier.layout.describe())
        return llm

    LlamaProxy.load_llama_from_model_settings = staticmethod(tiered)
    return tiers


def main(argv: Sequence[str] | None = None) -> None:
    ours, rest, config = parse_launcher_args(launcher_parser(), argv, "llama_cpp.server")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    storage = LazyStorage(lambda: open_cluster(config))
    tiers = install(storage, block_size=ours.tierkv_block_size, tenant=ours.tierkv_tenant)
    sys.argv = ["tierkv llama-serve", *rest]
    try:
        server_main.main()
    finally:
        for tier in tiers:
            tier.close()
        storage.close()


if __name__ == "__main__":
    main()
