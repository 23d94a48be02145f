"""Vaults in this process: the real vault service over a real store (LMDB in a temp dir), reached by the
real client through a :class:`~tierkv.client.mock.MockTransport` instead of a socket.

What is faked is only the carriage: no gRPC, no bulk port, no process. A fault switch per vault makes it
down (every call fails as UNAVAILABLE) or slow (each call waits ``delay_s`` first, on the real clock: the
cluster's deadlines and hedges are wall-clock waits). Processes stay for what only they show (signals,
kill -9, sockets) in the real-process tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tierkv.client._rpc import error_for
from tierkv.client.mock import MockTransport
from tierkv.client.transport import Request
from tierkv.client.vault import VaultClient
from tierkv.vault.auth import TokenTable
from tierkv.vault.calls import Calls
from tierkv.vault.metrics import VaultMetrics
from tierkv.vault.service import Limits, VaultService, parse_canonical, parse_message
from tierkv.vault.status import Abort
from tierkv.vault.store import Store
from tierkv.wire import pb


class InProcessVault:
    """One vault: a store, its service, and the handler a :class:`MockTransport` calls."""

    def __init__(
        self, path: Path, address: str, max_bytes: int = 64 << 20, clock: Callable[[], float] | None = None
    ) -> None:
        self.address = address
        self.store = Store(path, max_bytes, sync_mode="fast", maintenance_interval_s=3600, clock=clock)
        stats = self.store.stats
        self.service = VaultService(
            self.store, role="kv_cold", limits=Limits(), calls=Calls(VaultMetrics(stats), TokenTable({}))
        )
        self.down = False
        self.delay_s = 0.0
        self.calls: list[str] = []
        self._lock = threading.Lock()
        s = self.service
        self._unary: dict[str, tuple[Any, Callable[..., Any], Callable[..., Any]]] = {
            "PrefixLookup": (pb.PrefixLookupRequest, s.prefix_lookup, parse_message),
            "Delete": (pb.DeleteRequest, s.delete, parse_message),
            "Stats": (pb.StatsRequest, s.stats, parse_message),
            "Flush": (pb.FlushRequest, s.flush, parse_canonical),
            "Successors": (pb.SuccessorsRequest, s.successors, parse_message),
            "Hottest": (pb.HottestRequest, s.hottest, parse_message),
            "Inspect": (pb.InspectRequest, s.inspect, parse_message),
            "ListNamespaces": (pb.ListNamespacesRequest, s.list_namespaces, parse_message),
        }

    def client(self, **options: Any) -> VaultClient:
        return VaultClient(self.address, transport=MockTransport(self.handle), **options)

    def handle(self, request: Request) -> bytes:
        name = request.method.rsplit("/", 1)[-1]
        with self._lock:
            self.calls.append(name)
        if self.delay_s:
            time.sleep(min(self.delay_s, request.remaining()))
            if request.remaining() <= 0:
                raise error_for("DEADLINE_EXCEEDED", "deadline exceeded", self.address)
        if self.down:
            raise error_for("UNAVAILABLE", "connection refused", self.address)
        try:
            with self.service.calls.scope(name, None, self.address) as who:
                return self._dispatch(name, who, request)
        except Abort as exc:
            raise error_for(exc.status.name, exc.details, self.address) from None

    def _dispatch(self, name: str, who: Any, request: Request) -> bytes:
        if name == "Put":
            frames: Iterable[bytes] = request.body if not isinstance(request.body, bytes) else [request.body]
            return self.service.put(who, frames).SerializeToString()
        body = request.body if isinstance(request.body, bytes) else b"".join(request.body)
        if name == "BatchGet":
            reply = self.service.batch_get(who, parse_message(pb.BatchGetRequest, body))
            assert request.sink is not None
            try:
                for parts in reply.frames():
                    data = b"".join(parts)
                    reply.release()
                    request.sink(data)
            finally:
                self.service.finish_batch_get(reply)
            return b""
        request_type, fn, parse = self._unary[name]
        return bytes(fn(who, parse(request_type, body)).SerializeToString())

    def close(self) -> None:
        self.store.close()


@contextmanager
def vaults(tmp_path: Path, n: int) -> Iterator[list[InProcessVault]]:
    made = [InProcessVault(tmp_path / f"v{i}", f"inproc-{i}:1") for i in range(n)]
    try:
        yield made
    finally:
        for v in made:
            v.close()


def factory(made: list[InProcessVault], **options: Any) -> Callable[[str], VaultClient]:
    """A cluster's client factory over these vaults, by address."""
    by_address = {v.address: v for v in made}
    return lambda address: by_address[address].client(**options)
