"""Vault lifecycle: bind, serve, report health, shut down gracefully.

Shutdown order on SIGTERM/SIGINT: health goes NOT_SERVING (load balancers stop sending), new calls are
refused with UNAVAILABLE, in-flight calls get ``grace_s`` to finish, then the store writes pending recency,
fsyncs and closes, and the process exits 0. Readiness (``READY=1`` to systemd, the ready file, the log line)
is announced only once the port is bound and the store is open.
"""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tierkv._malloc import tune_malloc
from tierkv.config import Config
from tierkv.errors import ConfigError
from tierkv.vault.auth import TokenAuthInterceptor
from tierkv.vault.bulk import BulkServer
from tierkv.vault.metrics import VaultMetrics
from tierkv.vault.notify import sd_notify
from tierkv.vault.policy import make_policy
from tierkv.vault.service import Limits, VaultService
from tierkv.vault.store import Store
from tierkv.wire import SERVICE

log = logging.getLogger(__name__)


class PortInUseError(OSError):
    """The vault's port is taken (by another vault or anything else)."""


class VaultServer:
    """One vault: an LMDB store behind a gRPC server. ``start()`` returns the bound port."""

    def __init__(self, config: Config) -> None:
        self.config = config
        vc = config.vault
        tune_malloc()
        self.store = Store(
            vc.resolved_path(),
            vc.max_bytes,
            sync_mode=vc.sync,
            policy=make_policy(vc.policy),
            maintenance_interval_s=vc.sync_interval_s,
        )
        self.metrics = VaultMetrics(self.store.stats)
        role = config.cluster.role if config.cluster.role != "inference" else "kv_cold"
        self.service = VaultService(
            self.store,
            role=role,
            metrics=self.metrics,
            limits=Limits(
                frame_bytes=vc.frame_bytes,
                max_item_bytes=vc.max_batch_bytes,
                max_batch_bytes=vc.max_batch_bytes,
            ),
        )
        self.health = health.HealthServicer()
        token = config.auth.load_token()
        interceptors: list[grpc.ServerInterceptor[Any, Any]] = [TokenAuthInterceptor(token)] if token else []
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=vc.workers, thread_name_prefix="tierkv-rpc"),
            interceptors=interceptors,
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", vc.max_message_bytes),
                ("grpc.max_send_message_length", vc.max_message_bytes),
            ],
            maximum_concurrent_rpcs=vc.workers * 4,
        )
        self._server.add_generic_rpc_handlers((self.service.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.port = 0
        self.bulk: BulkServer | None = None
        self.authenticated = bool(token)
        self._stopped = threading.Event()

    def start(self) -> int:
        vc = self.config.vault
        address = _join(vc.host, vc.port)
        try:
            if self.config.tls.enabled:
                port = self._server.add_secure_port(address, _server_credentials(self.config))
            else:
                port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            self.store.close()
            raise PortInUseError(f"cannot bind {address}: {exc} (is another vault running there?)") from exc
        if port == 0:
            self.store.close()
            raise PortInUseError(f"cannot bind {address}: the port is taken or the address is not local")
        self.port = port
        self.bulk = self._start_bulk()
        self._server.start()
        for name in ("", SERVICE):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if vc.metrics_port:
            self.metrics.serve_http(vc.metrics_host or vc.host, vc.metrics_port)
        log.info(
            "vault serving on %s (store %s, budget %d bytes, sync %s, auth %s, tls %s)",
            _join(vc.host, port),
            self.store.path,
            vc.max_bytes,
            vc.sync,
            "on" if self.authenticated else "off",
            "on" if self.config.tls.enabled else "off",
        )
        return port

    def _start_bulk(self) -> BulkServer | None:
        vc = self.config.vault
        if not vc.bulk:
            return None
        if self.config.tls.enabled:
            log.info("TLS is on: BatchGet stays on gRPC (the bulk port is plaintext)")
            return None
        try:
            bulk = BulkServer(self.service, vc.host, vc.bulk_port, token=self.config.auth.load_token())
        except OSError as exc:
            self.store.close()
            raise PortInUseError(f"cannot bind the bulk port {_join(vc.host, vc.bulk_port)}: {exc}") from exc
        bulk.start()
        self.service.bulk_port = bulk.port
        log.info("bulk data plane on %s", _join(vc.host, bulk.port))
        return bulk

    def stop(self, grace: float | None = None) -> None:
        """Graceful stop; safe to call twice."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        sd_notify("STOPPING=1")
        self.health.enter_graceful_shutdown()
        self.service.draining.set()
        grace_s = self.config.vault.grace_s if grace is None else grace
        self._server.stop(grace_s).wait()
        if self.bulk is not None:
            self.bulk.stop(grace_s)
        self.store.close()
        log.info("vault stopped")

    def serve_forever(self, ready_file: str | None = None) -> None:
        """Start, announce readiness, block until SIGTERM/SIGINT, stop gracefully."""
        done = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            done.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            port = self.start()
            if ready_file:
                tmp = Path(ready_file).with_suffix(".tmp")
                tmp.write_text(f"{port}\n")
                tmp.replace(ready_file)
            sd_notify("READY=1")
            print(f"tierkv vault serving on {_join(self.config.vault.host, port)}", flush=True)
            done.wait()
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _server_credentials(config: Config) -> grpc.ServerCredentials:
    tls = config.tls
    if not (tls.cert_file and tls.key_file):
        raise ConfigError(config.source, "tls", "a vault needs both tls.cert_file and tls.key_file")
    key = Path(tls.key_file).expanduser().read_bytes()
    cert = Path(tls.cert_file).expanduser().read_bytes()
    ca = Path(tls.ca_file).expanduser().read_bytes() if tls.ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )
