"""Keep glibc from returning freed memory to the kernel between batches.

The data path allocates many short-lived buffers of 256 KiB – 4 MiB (gRPC messages, blobs). With glibc's
defaults each one is a fresh ``mmap`` or is trimmed off the heap top when freed, so every batch pays page
faults again: on 2 cores that alone caps a BatchGet near 0.5 GB/s, while reused heap memory gets ~1.4 GB/s
(see docs/performance/index.md). Raising the mmap and trim thresholds keeps that memory in the heap for reuse.

It is process-wide, so it is applied once, on first use of a client or vault, and only with glibc. Set
``TIERKV_MALLOC_TUNING=0`` to leave the allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 512 * 1024 * 1024


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, looked up once (``find_library`` runs ``ldconfig``); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


@functools.cache
def tune_malloc() -> bool:
    """Apply the thresholds once; True if they are in force (False off glibc or when disabled)."""
    if os.environ.get("TIERKV_MALLOC_TUNING", "1") == "0" or (libc := _libc()) is None:
        return False
    try:
        mallopt = libc.mallopt
    except AttributeError:
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    log.debug("malloc tuning %s", "applied" if ok else "refused")
    return ok


def trim_heap() -> bool:
    """Give freed heap memory back to the kernel now (``malloc_trim``); False off glibc.

    The raised trim threshold above keeps memory for reuse between batches; after a burst (many large
    requests at once) a long-running process calls this so its RSS falls back.
    """
    libc = _libc()
    try:
        return libc is not None and bool(libc.malloc_trim(0))
    except AttributeError:
        return False
