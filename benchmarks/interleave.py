"""Run contenders interleaved: each once per repetition, in an order rotated from one to the next, so a
burst of outside load on a shared machine hits all of them instead of one."""

from __future__ import annotations

import time
from collections.abc import Callable


def rounds(contenders: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds of every contender per repetition, after one warm-up call each (which also makes the first
    writes, so that readers find their keys)."""
    for fn in contenders.values():
        fn()
    names = list(contenders)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return times


def interleaved(
    contenders: dict[str, Callable[[], object]], nbytes: int, repeats: int
) -> dict[str, list[float]]:
    """GB/s (``nbytes`` per call) of every contender per repetition, as :func:`rounds` times them."""
    return {name: [nbytes / s / 1e9 for s in times] for name, times in rounds(contenders, repeats).items()}
