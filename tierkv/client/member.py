"""One vault of a :class:`~tierkv.client.cluster.Cluster` as the cluster calls it: its client behind its
circuit breaker.

Every vault's share of a cluster call goes through :meth:`Member.call`, which is where a vault failure
becomes a miss: no time left, an open breaker or a :class:`~tierkv.errors.VaultError` answer
:data:`FAILED` (counted and logged, the breaker told); a success closes the breaker and records the call's
latency. The cluster decides which vaults to ask and merges their answers; it never sees the exception.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from tierkv.client.breaker import CircuitBreaker
from tierkv.client.metrics import ClusterMetrics
from tierkv.client.vault import VaultClient
from tierkv.errors import VaultError

log = logging.getLogger("tierkv.client.cluster")

T = TypeVar("T")
Work = Callable[[VaultClient, float | None], T]
"""One vault's share of a call: given its client and the seconds left (None: the client's own deadline)."""


class Failed(enum.Enum):
    FAILED = 0


FAILED = Failed.FAILED
"""A vault's share that gave no answer: failed, refused by the breaker, or out of time."""


class Member:
    """One vault of a role: its address, client and breaker, and the cluster's metrics it reports to."""

    def __init__(
        self, address: str, client: VaultClient, breaker: CircuitBreaker, metrics: ClusterMetrics
    ) -> None:
        self.address = address
        self.client = client
        self.breaker = breaker
        self.metrics = metrics

    def call(self, method: str, fn: Work[T], deadline: float | None) -> T | Failed:
        """This vault's share, as a miss (FAILED) when it fails, its breaker is open or no time is left."""
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            return FAILED
        if not self.breaker.allow():
            self.metrics.skipped.labels(self.address).inc()
            return FAILED
        start = time.perf_counter()
        try:
            result = fn(self.client, timeout)
        except VaultError as exc:
            self.breaker.failure()
            self.metrics.failures.labels(self.address, method).inc()
            log.warning("%s on %s failed, treating as miss: %s", method, self.address, exc)
            return FAILED
        finally:
            self.metrics.breaker.labels(self.address).set(int(self.breaker.state))
        self.breaker.success()
        self.metrics.breaker.labels(self.address).set(0)
        self.metrics.latency.labels(self.address, method).observe(time.perf_counter() - start)
        return result


__all__ = ["FAILED", "Failed", "Member", "Work"]
