"""What bounds the vault's memory: budgets of request bytes in flight, and when freed heap goes back.

Request bodies are held whole before the store writes them (a slow sender must never hold the write lock),
so every byte of a Put that has arrived but is not yet written counts against an :class:`InflightBudget`:
one for the bulk port, one for gRPC. A call that would go past it is refused (RESOURCE_EXHAUSTED, which
clients treat as a failed store or fall back from), and with several tenants no tenant may hold more than
:data:`TENANT_SHARE` of a budget, so one tenant's stalled senders leave room for the others.

The malloc tuning (:mod:`tierkv._malloc`) keeps freed memory in the heap for reuse, so a steady stream of
large calls runs without page faults. :class:`MemoryTrimmer` gives it back to the kernel once the vault has
had no large call for ``idle_s``, or — under memory pressure, when the process's anonymous memory passes
``pressure_bytes`` — right after a large call (at most once per ``pressure_interval_s``). It never trims on
a timer in the middle of a stream of calls: that made every few Puts fault their buffers in again.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Final

from tierkv._malloc import trim_heap
from tierkv.limits import MiB
from tierkv.vault.status import Abort, Status

Clock = Callable[[], float]

LARGE_CALL_BYTES: Final = 16 * MiB
"""A call that moves at least this many bytes may leave freed heap behind (see :class:`MemoryTrimmer`)."""
TENANT_SHARE: Final = 0.75
"""With several tenants, the most of a shared budget (in-flight bytes, running calls) one tenant may hold."""
IDLE_TRIM_S: Final = 5.0
PRESSURE_BYTES: Final = 384 * MiB
PRESSURE_INTERVAL_S: Final = 1.0


def tenant_cap(total: int, tenants: int) -> int:
    """The share of ``total`` one of ``tenants`` tenants may hold: all of it when it is the only one."""
    return total if tenants <= 1 else max(1, int(total * TENANT_SHARE))


class InflightBudget:
    """Bytes of request bodies held at once (over every connection of one transport), and per tenant."""

    def __init__(
        self, limit: int, *, what: str, tenants: int = 1, on_large: Callable[[], None] | None = None
    ) -> None:
        self.limit = limit
        self.on_large = on_large
        """Called when a large call (or a burst adding up to one) gives its bytes back: a trim may be due."""
        self.tenant_limit = tenant_cap(limit, tenants)
        self.what = what
        self.held = 0
        self.peak = 0
        self._by_tenant: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, n: int, tenant: str) -> None:
        """Hold ``n`` more bytes for ``tenant``; RESOURCE_EXHAUSTED (nothing held) when it would not fit."""
        with self._lock:
            if self.held + n > self.limit:
                raise Abort(Status.RESOURCE_EXHAUSTED, f"too many request bytes in flight on {self.what}")
            if self._by_tenant[tenant] + n > self.tenant_limit:
                raise Abort(
                    Status.RESOURCE_EXHAUSTED,
                    f"tenant {tenant!r} holds its share of the request bytes in flight on {self.what}",
                )
            self.held += n
            self._by_tenant[tenant] += n
            self.peak = max(self.peak, self.held)

    def give(self, n: int, tenant: str) -> None:
        """Return ``n`` bytes. ``on_large`` hears of it when they were :data:`LARGE_CALL_BYTES` or more, or
        when the budget falls idle after a burst that peaked there (a refused call's bytes count too)."""
        with self._lock:
            self.held -= n
            self._by_tenant[tenant] -= n
            if self._by_tenant[tenant] <= 0:
                del self._by_tenant[tenant]
            peak = 0
            if not self.held:
                peak, self.peak = self.peak, 0
        if self.on_large is not None and max(n, peak) >= LARGE_CALL_BYTES:
            self.on_large()


def anon_rss_bytes() -> int:
    """The process's resident memory that is not file-backed (heap, stacks), from ``/proc/self/statm``;
    0 where there is no such file."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
    except OSError:
        return 0
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


class MemoryTrimmer:
    """Trims the heap once the vault is idle, or right away under memory pressure (see the module)."""

    def __init__(
        self,
        *,
        idle_s: float = IDLE_TRIM_S,
        pressure_bytes: int = PRESSURE_BYTES,
        pressure_interval_s: float = PRESSURE_INTERVAL_S,
        clock: Clock = time.monotonic,
        trim: Callable[[], bool] = trim_heap,
        anon_bytes: Callable[[], int] = anon_rss_bytes,
    ) -> None:
        self.idle_s = idle_s
        self.pressure_bytes = pressure_bytes
        self.pressure_interval_s = pressure_interval_s
        self.trims = 0
        self._clock = clock
        self._trim = trim
        self._anon_bytes = anon_bytes
        self._wake = threading.Condition()
        self._last_large: float | None = None
        """When the last large call ended; None when nothing was freed since the last trim."""
        self._last_trim = -float("inf")
        self._follow_up = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    def large_call_ended(self) -> None:
        """A call that held at least :data:`LARGE_CALL_BYTES` ended: trim later, or now under pressure."""
        now = self._clock()
        pressed = (
            now - self._last_trim >= self.pressure_interval_s and self._anon_bytes() > self.pressure_bytes
        )
        with self._wake:
            self._last_large = now
            self._follow_up = False
            self._wake.notify()
        if pressed:
            self._run_trim(now)

    def due_in(self, now: float) -> float | None:
        """Seconds until the idle trim is due (0: now); None when there is nothing to trim."""
        with self._wake:
            return self._due(now)

    def _due(self, now: float) -> float | None:
        if self._last_large is None:
            return None
        return max(0.0, self._last_large + self.idle_s - now)

    def tick(self) -> bool:
        """Trim if the vault has been idle long enough since its last large call; True if it trimmed.

        An idle trim is followed by one more ``idle_s`` later: what the calls that ended the burst free
        after the first (connections closing, replies draining) goes back too."""
        now = self._clock()
        if self.due_in(now) != 0.0:
            return False
        trimmed = self._run_trim(now)
        with self._wake:
            self._follow_up = not self._follow_up
            if self._follow_up and self._last_large is None:
                self._last_large = now
        return trimmed

    def _run_trim(self, now: float) -> bool:
        with self._wake:
            self._last_large = None
            self._last_trim = now
        if not self._trim():
            return False
        self.trims += 1
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tierkv-trim", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._wake:
                if self._stopping:
                    return
                self._wake.wait(self._due(self._clock()))
                if self._stopping:
                    return
            self.tick()
