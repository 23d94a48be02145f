"""The llama.cpp hook (extra ``tierkv[llamacpp]``): llama-cpp-python sequence state in token blocks.

- :mod:`~tierkv.connectors.llamacpp.state`: llama.cpp's saved KV state parsed, cut into token blocks
  and a leading run rebuilt (numpy only; refuses layouts it does not know);
- :mod:`~tierkv.connectors.llamacpp.hook`: :class:`LlamaTier`, restore before a call and store after,
  over the shared pipeline (:mod:`tierkv.tiering`); :class:`TieredLlamaCache` plugs it into
  ``Llama.set_cache`` and so into ``llama_cpp.server``;
- :mod:`~tierkv.connectors.llamacpp.serve`: ``tierkv llama-serve``, llama-cpp-python's OpenAI server
  with the tier.

Only ``state`` imports nothing of llama-cpp-python; the other names load it on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tierkv.connectors.llamacpp.state import FORMAT, KVState, StateLayout, blocks, parse, rebuild

if TYPE_CHECKING:
    from tierkv.connectors.llamacpp.cache import TieredLlamaCache
    from tierkv.connectors.llamacpp.hook import LlamaTier

_LAZY = {"LlamaTier": "hook", "TieredLlamaCache": "cache"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = ["FORMAT", "KVState", "LlamaTier", "StateLayout", "TieredLlamaCache", "blocks", "parse", "rebuild"]
