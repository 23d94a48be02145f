"""A per-vault circuit breaker: stop calling a dead vault, probe it again later.

Closed → (``threshold`` consecutive failures) → open for ``backoff`` seconds → half-open: one probe call is
let through; success closes the breaker, failure re-opens it with the backoff doubled (up to ``max_backoff``).
While open, the cluster treats the vault's keys as misses without touching the network.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable


class BreakerState(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    def __init__(
        self,
        *,
        threshold: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.base_backoff = backoff_s
        self.max_backoff = max_backoff_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._backoff = backoff_s
        self._open_until = 0.0
        self._state = BreakerState.CLOSED
        self._probing = False

    @property
    def state(self) -> BreakerState:
        with self._lock:
            if self._state is BreakerState.OPEN and self._clock() >= self._open_until:
                return BreakerState.HALF_OPEN
            return self._state

    def allow(self) -> bool:
        """May a call go out now? In half-open state only one probe at a time is allowed."""
        with self._lock:
            if self._state is BreakerState.CLOSED:
                return True
            if self._clock() < self._open_until or self._probing:
                return False
            self._state = BreakerState.HALF_OPEN
            self._probing = True
            return True

    def success(self) -> None:
        with self._lock:
            self._failures = 0
            self._backoff = self.base_backoff
            self._state = BreakerState.CLOSED
            self._probing = False

    def failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._state is BreakerState.HALF_OPEN:
                self._backoff = min(self._backoff * 2, self.max_backoff)
                self._trip()
            elif self._failures >= self.threshold:
                self._trip()

    def _trip(self) -> None:
        self._state = BreakerState.OPEN
        self._open_until = self._clock() + self._backoff
        self._probing = False
