"""The llama.cpp hook (extra ``tierkv[llamacpp]``): llama-cpp-python sequence state in token blocks.

- :mod:`~tierkv.connectors.llamacpp.state`: llama.cpp's saved KV state parsed, cut into token blocks
  and a leading run rebuilt (numpy only; refuses layouts it does not know).
"""

from tierkv.connectors.llamacpp.state import FORMAT, KVState, StateLayout, blocks, parse, rebuild

__all__ = ["FORMAT", "KVState", "StateLayout", "blocks", "parse", "rebuild"]
