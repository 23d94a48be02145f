"""A per-vault circuit breaker: stop calling a dead vault, probe it again later.

Closed → (``threshold`` consecutive failures) → open for ``backoff`` seconds → half-open: one probe call is
let through; success closes the breaker, failure re-opens it with the backoff doubled (up to ``max_backoff``).
While open, the cluster treats the vault's keys as misses without touching the network.

Each call let through gets a ticket, the breaker's epoch (one more at every opening), and says it when it
fails: a failure of a call that started before the breaker last opened says nothing of the vault now, so
it neither reopens a half-open breaker as if the probe had failed nor pushes an open one's end further.
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
        self._epoch = 1

    @property
    def state(self) -> BreakerState:
        with self._lock:
            if self._state is BreakerState.OPEN and self._clock() >= self._open_until:
                return BreakerState.HALF_OPEN
            return self._state

    def allow(self) -> int | None:
        """The ticket of a call that may go out now (an epoch, never 0), or None. In half-open state only
        one probe at a time is let through."""
        with self._lock:
            if self._state is BreakerState.CLOSED:
                return self._epoch
            if self._clock() < self._open_until or self._probing:
                return None
            self._state = BreakerState.HALF_OPEN
            self._probing = True
            return self._epoch

    def success(self) -> None:
        with self._lock:
            self._failures = 0
            self._backoff = self.base_backoff
            self._state = BreakerState.CLOSED
            self._probing = False

    def failure(self, ticket: int | None = None) -> None:
        """A call failed; ``ticket`` is what :meth:`allow` gave it (None: taken as started now)."""
        with self._lock:
            if ticket is not None and ticket != self._epoch:
                return  # started before the breaker last opened
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
        self._epoch += 1
