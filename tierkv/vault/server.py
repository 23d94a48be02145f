"""Vault lifecycle: bind, serve, report health, shut down gracefully.

Build order: the store, the token table (tenants and their quotas come from it), the bulk listener (so
its port is known before the service that advertises it is built), the service, the front ends.

Shutdown on SIGTERM, SIGINT or SIGHUP (a vault has nothing to reload; a closed terminal or ``kill -HUP``
stops it the same graceful way): health goes NOT_SERVING (load balancers stop sending), new calls are
refused with UNAVAILABLE, in-flight calls get ``grace_s`` to finish, then the store writes pending recency,
fsyncs and closes, and the process exits 0. Readiness (``READY=1`` to systemd, the ready file, the start-up
line) is announced only once the ports are bound and the store is open.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import select
import signal
import socket
import threading
from concurrent import futures
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tierkv import __version__
from tierkv._malloc import tune_malloc
from tierkv.config import Config, format_size
from tierkv.endpoints import bind_problem, join_host_port
from tierkv.errors import ConfigError
from tierkv.logs import console_shows
from tierkv.roles import Role
from tierkv.vault import grpc_edge
from tierkv.vault.admission import Admission, AdmissionLimits, grpc_threads
from tierkv.vault.auth import check_open, exposure_warning, load_tokens
from tierkv.vault.bulk import BulkLimits, BulkServer, bind_listener
from tierkv.vault.calls import Calls
from tierkv.vault.memory import InflightBudget
from tierkv.vault.metrics import VaultMetrics
from tierkv.vault.notify import sd_notify
from tierkv.vault.policy import make_policy
from tierkv.vault.service import Limits, VaultService
from tierkv.vault.store import Store
from tierkv.vault.successors import TenantLearners
from tierkv.wire import SERVICE

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class PortInUseError(OSError):
    """The vault's port is taken (by another vault or anything else)."""


def served_role(config: Config) -> Role:
    """The cold role a vault serves (an ``inference`` node running a vault serves ``kv_cold``)."""
    role = Role.parse(config.cluster.role)
    return role if role.cold else Role.KV_COLD


class VaultServer:
    """One vault: an LMDB store behind a gRPC server and the bulk port. ``start()`` returns the port."""

    def __init__(self, config: Config) -> None:
        self.config = config
        vc = config.vault
        tune_malloc()
        self.tokens = load_tokens(config.auth, config.source)
        self.tokens.check_budget(vc.max_bytes, config.source_of("vault.max_bytes"))
        check_open(self.tokens, config.auth, vc.host, config.source_of("vault.host"))
        for warning in (*self.tokens.warnings, exposure_warning(config.auth)):
            if warning:
                log.warning("%s", warning)
        self.store = Store(
            vc.resolved_path(),
            vc.max_bytes,
            sync_mode=vc.sync,
            policy=make_policy(vc.policy, config.retention.weights),
            maintenance_interval_s=vc.sync_interval_s,
            tenants=self.tokens.tenants,
            on_damage=vc.on_damage,
            max_protected_fraction=config.retention.max_protected_fraction,
        )
        self.role = served_role(config)
        self.metrics = VaultMetrics(
            self.store.stats,
            role=self.role.value,
            version=__version__,
            tenants=self.store.tenant_usage,
            classes=self.store.class_usage,
        )
        self.admission = AdmissionLimits.for_workers(vc.workers)
        self.calls = Calls(
            self.metrics, self.tokens, Admission(self.admission, tenants=len(self.store.tenant_names))
        )
        try:
            self._bulk_listener = self._bind_bulk()
            self.service = VaultService(
                self.store,
                role=self.role.value,
                calls=self.calls,
                bulk_port=self._bulk_listener.getsockname()[1] if self._bulk_listener else 0,
                limits=Limits(
                    frame_bytes=vc.frame_bytes,
                    max_item_bytes=vc.max_batch_bytes,
                    max_batch_bytes=vc.max_batch_bytes,
                    max_message_bytes=vc.max_message_bytes,
                ),
                successors=TenantLearners(self.store.tenant_names, window_s=vc.coaccess_window_s),
            )
        except BaseException:
            self.store.close()
            raise
        self.health = health.HealthServicer()
        self._server = grpc.server(
            # no maximum_concurrent_rpcs: gRPC would refuse health checks at it too; admission bounds the
            # vault's calls instead and the pool keeps threads for health (see tierkv.vault.admission)
            futures.ThreadPoolExecutor(
                max_workers=grpc_threads(self.admission), thread_name_prefix="tierkv-rpc"
            ),
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.http2.bdp_probe", int(vc.grpc_bdp_probe)),
                ("grpc.max_receive_message_length", vc.max_message_bytes),
                ("grpc.max_send_message_length", vc.max_message_bytes),
            ],
        )
        grpc_budget = InflightBudget(
            vc.grpc_max_inflight_bytes,
            what="gRPC",
            tenants=len(self.store.tenant_names),
            on_large=self.calls.memory.large_call_ended,
        )
        self._server.add_generic_rpc_handlers((grpc_edge.handler(self.service, grpc_budget),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.port = 0
        self.bulk: BulkServer | None = None
        self._stopped = threading.Event()

    @property
    def authenticated(self) -> bool:
        return self.tokens.enabled

    def _bind_bulk(self) -> socket.socket | None:
        vc = self.config.vault
        if not vc.bulk:
            return None
        if self.config.tls.enabled:
            log.info("TLS is on: BatchGet stays on gRPC (the bulk port is plaintext)")
            return None
        try:
            return bind_listener(vc.host, vc.bulk_port)
        except OSError as exc:
            raise PortInUseError(
                f"cannot bind the bulk port {join_host_port(vc.host, vc.bulk_port)}: {exc}"
            ) from exc

    def start(self) -> int:
        vc = self.config.vault
        address = join_host_port(vc.host, vc.port)
        taken = bind_problem(vc.host, vc.port) if vc.port else ""
        if taken:
            # asked before gRPC tries: its own failure is a core log line and a message about GRPC_VERBOSITY
            self._abandon()
            raise PortInUseError(
                f"cannot bind {address}: {taken} "
                "(is another vault running there? pick another --port or [vault] port)"
            )
        try:
            if self.config.tls.enabled:
                port = self._server.add_secure_port(address, _server_credentials(self.config))
            else:
                port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            self._abandon()
            raise PortInUseError(f"cannot bind {address}: {exc} (is another vault running there?)") from exc
        if port == 0:
            self._abandon()
            raise PortInUseError(f"cannot bind {address}: the port is taken or the address is not local")
        self.port = port
        if self._bulk_listener is not None:
            self.bulk = BulkServer(
                self.service,
                self._bulk_listener,
                limits=BulkLimits(
                    max_connections=vc.bulk_max_connections,
                    idle_timeout_s=vc.bulk_idle_timeout_s,
                    max_inflight_bytes=vc.bulk_max_inflight_bytes,
                ),
            )
            self.bulk.start()
        self._server.start()
        self.calls.memory.start()
        for name in ("", SERVICE):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if vc.metrics_port:
            self.metrics.serve_http(vc.metrics_host or vc.host, vc.metrics_port)
        if not self.authenticated:
            log.warning("%s", self.tokens.describe())
        log.info("%s", self.startup_line())
        return port

    def startup_facts(self) -> dict[str, Any]:
        """What the start-up line says, as data (the JSON form under ``[log] json = true``)."""
        vc = self.config.vault
        metrics = join_host_port(vc.metrics_host or vc.host, vc.metrics_port) if vc.metrics_port else "off"
        return {
            "event": "vault_serving",
            "version": __version__,
            "role": self.role.value,
            "address": join_host_port(vc.host, self.port),
            "bulk": self.bulk.address if self.bulk else "off",
            "bulk_max_connections": self.bulk.max_connections if self.bulk else 0,
            "store": str(self.store.path),
            "budget_bytes": vc.max_bytes,
            "policy": vc.policy,
            "sync": vc.sync,
            "auth": "on" if self.authenticated else "off",
            "tenants": len(self.store.tenant_names),
            "tls": "on" if self.config.tls.enabled else "off",
            "metrics": metrics,
        }

    def startup_line(self) -> str:
        facts = self.startup_facts()
        if self.config.log.json:
            return json.dumps(facts)
        rest = ", ".join(
            _text_fact(k, v) for k, v in facts.items() if k not in ("event", "address", "version")
        )
        return f"tierkv {facts['version']} vault serving on {facts['address']} ({rest})"

    def _abandon(self) -> None:
        """Undo what ``__init__`` opened when the vault never started: nothing is left for ``stop`` to do
        (and no "vault stopped" line for a vault that never served)."""
        self._stopped.set()
        if self._bulk_listener is not None:
            self._bulk_listener.close()
        self.store.close()

    def stop(self, grace: float | None = None) -> None:
        """Graceful stop; safe to call twice."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        sd_notify("STOPPING=1")
        self.health.enter_graceful_shutdown()
        self.calls.draining.set()
        grace_s = self.config.vault.grace_s if grace is None else grace
        self._server.stop(grace_s).wait()
        if self.bulk is not None:
            self.bulk.stop(grace_s)
        elif self._bulk_listener is not None:
            self._bulk_listener.close()
        self.calls.rejects.flush()
        self.calls.memory.stop()
        self.store.close()
        log.info("vault stopped")

    def serve_forever(self, ready_file: str | None = None) -> None:
        """Start, announce readiness, block until a stop signal, stop gracefully."""
        done = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s, shutting down gracefully", signal.Signals(signum).name)
            done.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
        try:
            port = self.start()
            # what start-up made (modules, the store, the servers: ~37k objects) lives as long as the
            # process; frozen, no full collection walks it again, while serving (15-20 ms each) or the
            # several at exit (~60 ms of a vault's shutdown)
            gc.freeze()
            if ready_file:
                tmp = Path(ready_file).with_suffix(".tmp")
                tmp.write_text(f"{port}\n")
                tmp.replace(ready_file)
            sd_notify("READY=1")
            # start() logged the line; a terminal that shows INFO logs needs no second copy (JSON logs
            # keep the bare JSON object on stdout, for whatever parses it)
            if self.config.log.json or not console_shows(logging.INFO):
                print(self.startup_line(), flush=True)
            wait_for_signal(done)
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _text_fact(key: str, value: Any) -> str:
    """One fact of the start line as a person reads it: the budget as it is written in tierkv.toml."""
    return f"budget {format_size(value)}" if key == "budget_bytes" else f"{key} {value}"


def wait_for_signal(done: threading.Event) -> None:
    """Block the main thread until a stop signal's handler has set ``done``.

    Python runs signal handlers in the main thread only, between bytecodes, and the kernel may hand a
    process-directed signal to any thread (it passes over a main thread that is stopped for a tracer such
    as strace). A main thread asleep in ``Event.wait()`` is woken only by a signal delivered to itself, so
    such a signal would go unnoticed. The wakeup fd is written by whichever thread catches the signal:
    ``select`` on it returns, and the handler runs as soon as the main thread executes Python again.
    """
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    try:
        while not done.is_set():
            select.select([reader], [], [])
            with contextlib.suppress(BlockingIOError):
                reader.recv(4096)
    finally:
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()


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
