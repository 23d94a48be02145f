"""A :class:`~tierkv.connectors.vllm.scheduler.LookupClock` for tests: time moves when the test says so.

A wait really waits for the lookups (they run on real vault processes) for up to ``guard_s`` seconds of
wall time; lookups that finished cost ``tick_s`` of this clock's time, lookups still running the wait's
whole timeout — the budget a hung vault uses up. Budgets and lease ages are then checked exactly,
whatever the machine's load.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, wait


class StepClock:
    def __init__(self, *, guard_s: float = 30.0, tick_s: float = 0.001) -> None:
        self.now = 0.0
        self.guard_s = guard_s
        self.tick_s = tick_s
        self.waits: list[float] = []
        """The timeout of every wait, in order."""

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def wait(self, futures: Sequence[Future[int]], timeout: float) -> None:
        self.waits.append(timeout)
        _, pending = wait(futures, timeout=self.guard_s)
        self.now += timeout if pending else min(self.tick_s, timeout)
