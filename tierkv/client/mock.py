"""A transport answered in this process, as httpx's ``MockTransport``: for fast tests of clients and
:class:`~tierkv.client.cluster.Cluster` (hedging, breakers, fan-out) without sockets.

The handler gets each :class:`~tierkv.client.transport.Request` and returns the reply message (or, for a
server-streaming method, passes each reply message to ``request.sink`` and returns ``b""``), or raises a
:class:`~tierkv.errors.VaultError` as a failing vault would. What it answers is up to the test: a real
vault service over a real store in the same process, or a canned reply.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tierkv.client.transport import Request, Transport

Handler = Callable[[Request], bytes]


class MockTransport(Transport):
    """Every call answered by ``handler``; ``methods`` records each call's method name, in order."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.methods: list[str] = []
        self.closed = False
        self._lock = threading.Lock()

    def handle(self, request: Request) -> bytes:
        with self._lock:
            self.methods.append(request.method.rsplit("/", 1)[-1])
        return self.handler(request)

    def close(self) -> None:
        self.closed = True


__all__ = ["Handler", "MockTransport"]
