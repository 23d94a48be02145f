"""Admission: how many calls run at once, per vault, per tenant and per connection, so that one tenant's
(or one connection's) flood cannot take the vault from the others.

Every call on either transport is admitted here once its caller is known (see :meth:`Calls.scope
<tierkv.vault.calls.Calls.scope>`). At most ``running`` calls run at once; with several tenants one tenant
runs at most :data:`~tierkv.vault.memory.TENANT_SHARE` of them, so another tenant always finds a free slot.
A call that finds no slot waits up to ``wait_s`` in a queue of at most ``waiting`` calls (a tenant holds at
most the same share of it); one connection has at most ``per_connection`` calls running or waiting. Past
any of these the call is refused at once with RESOURCE_EXHAUSTED, which clients treat as a miss (lookups,
reads) or a blob not stored (Puts), never as an error in the serving path.

Health checks are not calls of the vault service: they never pass through here, and the gRPC server keeps
threads for them (see :func:`grpc_threads`), so health always answers, whatever the load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Final

from tierkv.vault.memory import tenant_cap
from tierkv.vault.status import Abort, Status

ADMISSION_WAIT_S: Final = 0.25
"""The longest a call waits for a slot before it is refused."""
HEALTH_THREADS: Final = 8
"""gRPC threads beyond every running and waiting call: health checks and refusals always find one."""


@dataclasses.dataclass(frozen=True)
class AdmissionLimits:
    running: int = 16
    waiting: int = 32
    per_connection: int = 32
    wait_s: float = ADMISSION_WAIT_S

    @classmethod
    def for_workers(cls, workers: int) -> AdmissionLimits:
        """The limits that go with ``[vault] workers``: that many calls run, twice as many may wait, one
        connection holds at most twice ``workers`` of them (so never the whole queue)."""
        return cls(running=workers, waiting=2 * workers, per_connection=2 * workers)


def grpc_threads(limits: AdmissionLimits) -> int:
    """Threads the gRPC server needs so that a health check never waits behind vault calls: one for every
    call running or waiting, plus :data:`HEALTH_THREADS` (refusals are answered at once)."""
    return limits.running + limits.waiting + HEALTH_THREADS


class Admission:
    """Slots for running calls and places in the queue, counted overall, per tenant and per connection."""

    def __init__(self, limits: AdmissionLimits, *, tenants: int = 1) -> None:
        self.limits = limits
        self.tenant_running = tenant_cap(limits.running, tenants)
        self.tenant_waiting = tenant_cap(limits.waiting, tenants)
        self.refused = 0
        self._cond = threading.Condition()
        self._running: Counter[str] = Counter()
        self._waiting: Counter[str] = Counter()
        self._connections: Counter[str] = Counter()

    @property
    def running(self) -> int:
        return self._running.total()

    @property
    def waiting(self) -> int:
        return self._waiting.total()

    @contextlib.contextmanager
    def admit(self, tenant: str, connection: str) -> Iterator[None]:
        """Run the block in a slot of ``tenant``'s, or raise RESOURCE_EXHAUSTED (see the module)."""
        with self._cond:
            self._enter(tenant, connection)
        try:
            yield
        finally:
            with self._cond:
                _drop(self._running, tenant)
                _drop(self._connections, connection)
                self._cond.notify_all()

    def _enter(self, tenant: str, connection: str) -> None:
        if self._connections[connection] >= self.limits.per_connection:
            self._refuse(f"this connection has {self.limits.per_connection} calls in flight")
        self._connections[connection] += 1
        try:
            if not self._free(tenant):
                self._wait(tenant)
        except Abort:
            _drop(self._connections, connection)
            raise
        self._running[tenant] += 1

    def _free(self, tenant: str) -> bool:
        return self.running < self.limits.running and self._running[tenant] < self.tenant_running

    def _wait(self, tenant: str) -> None:
        if self.waiting >= self.limits.waiting or self._waiting[tenant] >= self.tenant_waiting:
            self._refuse(f"vault busy: tenant {tenant!r} has {self._running[tenant]} calls running")
        self._waiting[tenant] += 1
        try:
            deadline = time.monotonic() + self.limits.wait_s
            while not self._free(tenant):
                left = deadline - time.monotonic()
                if left <= 0:
                    self._refuse(f"vault busy: no slot for tenant {tenant!r} within {self.limits.wait_s:g} s")
                self._cond.wait(left)
        finally:
            _drop(self._waiting, tenant)

    def _refuse(self, why: str) -> None:
        self.refused += 1
        raise Abort(Status.RESOURCE_EXHAUSTED, why)


def _drop(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
