"""One vault of a :class:`~tierkv.client.cluster.Cluster` as the cluster calls it: its client behind its
circuit breaker.

Every vault's share of a cluster call goes through :meth:`Member.call`, which is where a vault failure
becomes a miss: no time left, an open breaker or a :class:`~tierkv.errors.VaultError` answer
:data:`FAILED` (counted and logged, the breaker told); a success closes the breaker and records the call's
latency; a refusal (the vault answered, but no) is counted apart and leaves the breaker closed; a share
cut short after part of it was answered (:class:`Partial`) is counted by its error and answers that part.
The cluster decides which vaults to ask and merges their answers; it never sees the exception.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar, cast

from tierkv.client.breaker import CircuitBreaker
from tierkv.client.metrics import ClusterMetrics
from tierkv.client.vault import VaultClient
from tierkv.errors import InvalidRequest, ResourceExhausted, VaultError
from tierkv.logs import Throttle

log = logging.getLogger("tierkv.client.cluster")

T = TypeVar("T")
Work = Callable[[VaultClient, float | None], T]
"""One vault's share of a call: given its client and the seconds left (None: the client's own deadline)."""


class Failed(enum.Enum):
    FAILED = 0


FAILED = Failed.FAILED
"""A vault's share that gave no answer: failed, refused by the breaker, or out of time."""


class Partial(Exception, Generic[T]):
    """Raised by a share that ended in ``error`` after part of it was answered: ``value`` is what was.
    :meth:`Member.call` counts the error as it would count it raised alone and answers ``value``; it
    never goes further."""

    def __init__(self, error: VaultError, value: T) -> None:
        super().__init__(str(error))
        self.error = error
        self.value = value


class Member:
    """One vault of a role: its address, client and breaker, and the cluster's metrics it reports to."""

    def __init__(
        self, address: str, client: VaultClient, breaker: CircuitBreaker, metrics: ClusterMetrics
    ) -> None:
        self.address = address
        self.client = client
        self.breaker = breaker
        self.metrics = metrics
        metrics.breaker.labels(address).set_function(lambda: int(breaker.state))  # true at every scrape
        self.pool = ThreadPoolExecutor(max_workers=MEMBER_THREADS, thread_name_prefix="tierkv-vault")
        """This vault's own threads for the shares a cluster call sends in parallel: a vault that stalls
        holds only these until its deadlines pass, never the threads another vault's shares need."""
        self._refusals = Throttle(REFUSAL_LOG_INTERVAL_S)

    def submit(self, method: str, fn: Work[T], deadline: float | None) -> Future[T | Failed]:
        """:meth:`call` on this vault's own threads."""
        return self.pool.submit(self.call, method, fn, deadline)

    def call(self, method: str, fn: Work[T], deadline: float | None) -> T | Failed:
        """This vault's share, as a miss (FAILED) when it fails, its breaker is open or no time is left;
        a share that raises :class:`Partial` answers what part of it was answered.

        A refusal (:data:`REFUSALS`: the vault's disk full, its in-flight bytes or call slots used up, a
        request over its limits) is counted as refused, never as a failure, and closes the breaker,
        because the vault answered: a vault that is full or busy keeps serving reads."""
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            self.metrics.expired.labels(self.address, method).inc()
            return FAILED
        ticket = self.breaker.allow()
        if ticket is None:
            self.metrics.skipped.labels(self.address).inc()
            return FAILED
        start = time.perf_counter()
        try:
            result = fn(self.client, timeout)
        except Partial as part:
            self._fault(method, part.error, ticket)
            return cast("T", part.value)
        except VaultError as exc:
            self._fault(method, exc, ticket)
            return FAILED
        except BaseException:
            self.breaker.failure(ticket)  # never leave a half-open probe out for good
            raise
        self._answered()
        self.metrics.latency.labels(self.address, method).observe(time.perf_counter() - start)
        return result

    def _fault(self, method: str, exc: VaultError, ticket: int) -> None:
        if isinstance(exc, REFUSALS):
            self._refused(method, exc)
            return
        self.breaker.failure(ticket)
        self.metrics.failures.labels(self.address, method).inc()
        log.warning("%s on %s failed, treating as miss: %s", method, self.address, exc)

    def _refused(self, method: str, exc: VaultError) -> None:
        """The vault answered this call with a refusal: it is up, so its breaker closes; counted, and
        logged at most once per :data:`REFUSAL_LOG_INTERVAL_S`."""
        self._answered()
        self.metrics.refused.labels(self.address, method).inc()
        due = self._refusals.add({method: 1})
        if due is not None:
            counts, span = due
            calls = ", ".join(f"{n} {m}" for m, n in sorted(counts.items()))
            log.warning("%s refused %s calls in the last %.0f s; it said: %s", self.address, calls, span, exc)

    def _answered(self) -> None:
        self.breaker.success()

    def close(self) -> None:
        """Wait for this vault's shares still out (each within its deadline), then close its client."""
        self.pool.shutdown(wait=True)
        self.client.close()


MEMBER_THREADS = 8
"""Shares one vault runs at once for parallel cluster calls (more wait their turn, within their deadline;
a call to one vault alone runs in its caller's thread)."""


REFUSAL_LOG_INTERVAL_S = 10.0
"""A vault's refusals are logged at most once per this many seconds (and counted always): a full vault
refuses every Put."""
REFUSALS = (ResourceExhausted, InvalidRequest)
"""Errors that are a vault's answer to one call, not a sign that it is down."""


__all__ = ["FAILED", "MEMBER_THREADS", "REFUSALS", "Failed", "Member", "Partial", "Work"]
