"""tierkv's log lines inside vLLM's log.

tierkv's modules only call ``logging.getLogger(__name__)``; vLLM configures a handler for its own ``vllm``
logger alone and leaves the root logger bare, so a connector's INFO lines (its start line with the
namespace, "restores off" and why, the ``kv_load_failure_policy`` switch) would vanish, and its warnings
would reach stderr without vLLM's prefix. When nothing else has configured logging, the ``tierkv`` logger
writes through vLLM's own handlers, at vLLM's level (``VLLM_LOGGING_LEVEL``), so the lines sit beside
vLLM's in the same format and stream. An application that configured the root logger keeps its own
setup: then nothing is attached.
"""

from __future__ import annotations

import logging

OURS = "tierkv"
THEIRS = "vllm"


def join_vllm_log() -> bool:
    """Send the ``tierkv`` logger's records to vLLM's handlers (once); True when they go there now."""
    ours = logging.getLogger(OURS)
    theirs = logging.getLogger(THEIRS)
    if any(h in ours.handlers for h in theirs.handlers) and theirs.handlers:
        return True
    if ours.handlers or logging.getLogger().handlers or not theirs.handlers:
        return False
    for handler in theirs.handlers:
        ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(theirs.level)
    return True


__all__ = ["join_vllm_log"]
