"""A multi-replica deployment on one host: vaults, vLLM replicas with TierKVConnector, vllm-router.

The launch lines built here are the documented ones (docs/concepts/routing.md):
each replica runs ``--enable-scale-out`` (vllm-router tokenizes through ``/v1/completions/render``) and
publishes its KV events, the connector's cold-tier events included (``kv_events: true``), to a bound
:class:`~tierkv.routing.forward.Forwarder` on the loopback interface; the router subscribes to each
forwarder with ``--kv-event-source URL=ENDPOINT``.

Every process is started here and stopped here, by its own PID.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierkv.connectors.vllm import CONNECTOR_NAME, MODULE_PATH
from tierkv.routing.forward import Forwarder
from tierkv.vault.launcher import VaultProcess, terminate

ROUTER_EXECUTABLE = "vllm-router"
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A free TCP port on the loopback interface (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def router_executable() -> str | None:
    """vllm-router next to this interpreter, else on PATH; None when it is not installed."""
    beside = Path(sys.executable).with_name(ROUTER_EXECUTABLE)
    if beside.exists():
        return str(beside)
    from shutil import which

    return which(ROUTER_EXECUTABLE)


def transfer_config(
    vaults: Sequence[str], *, namespace: str = "", timeout: float = 2.0, kv_events: bool = True, **more: Any
) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for TierKVConnector on ``vaults``, cold-tier events on by default;
    ``more`` are further connector settings (``load_mode="sync"`` ...)."""
    extra: dict[str, Any] = {"kv_cold": ",".join(vaults), "timeout": timeout, "kv_events": kv_events, **more}
    if namespace:
        extra["namespace"] = namespace
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": MODULE_PATH,
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


@dataclass(frozen=True)
class ReplicaSpec:
    """One vLLM OpenAI server: its model, port, KV event endpoint and (optional) connector vaults."""

    model: str
    served_name: str
    port: int
    events: str
    vaults: tuple[str, ...] = ()
    block_size: int = 32
    max_model_len: int = 1024
    extra_args: tuple[str, ...] = ()
    replay: str = ""
    cold_events: bool = True
    connector_extra: tuple[tuple[str, Any], ...] = ()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def command(self, python: str = sys.executable) -> list[str]:
        """The launch line (``vllm serve`` is the same entry point under the ``vllm`` distribution).

        ``replay`` is bound by vLLM itself (a ROUTER socket, any address): ``tierkv pages`` reads the
        buffered events there."""
        events: dict[str, Any] = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.events}
        if self.replay:
            events["replay_endpoint"] = self.replay
        args = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--served-model-name",
            self.served_name,
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--block-size",
            str(self.block_size),
            "--max-model-len",
            str(self.max_model_len),
            "--enable-scale-out",
            "--kv-events-config",
            json.dumps(events),
            *self.extra_args,
        ]
        if self.vaults:
            transfer = transfer_config(self.vaults, kv_events=self.cold_events, **dict(self.connector_extra))
            args += ["--kv-transfer-config", json.dumps(transfer)]
        return args


@dataclass(frozen=True)
class RouterSpec:
    """vllm-router in front of ``workers`` (URL → the endpoint it reads that worker's KV events from)."""

    port: int
    workers: dict[str, str]
    served_name: str
    policy: str = "kv_aware"
    block_size: int = 32
    prometheus_port: int = 0
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.prometheus_port}/metrics"

    def command(self, executable: str) -> list[str]:
        args = [
            executable,
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--policy",
            self.policy,
            "--worker-urls",
            *self.workers,
            "--prometheus-host",
            LOOPBACK,
            "--prometheus-port",
            str(self.prometheus_port),
            *self.extra_args,
        ]
        if self.policy == "kv_aware":
            for url, endpoint in self.workers.items():
                args += ["--kv-event-source", f"{url}={endpoint}"]
            args += ["--kv-event-block-size", str(self.block_size), "--kv-event-model", self.served_name]
        return args


@dataclass
class Process:
    """A child process started here, its log file, and a stop by its own PID."""

    name: str
    args: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.args,
                env={**os.environ, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None:
            terminate(self.proc, timeout)


def wait_healthy(url: str, process: Process, timeout: float) -> None:
    """Poll ``url`` until it answers 200; a clear error when the process died or time ran out."""
    deadline = time.monotonic() + timeout
    while True:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited at start-up:\n{process.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{process.name} not healthy after {timeout:.0f} s:\n{process.log_tail()}")
        time.sleep(0.5)


def post(url: str, body: dict[str, Any], timeout: float = 120.0) -> Any:
    """POST ``body`` as JSON; the decoded JSON reply."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def complete(base: str, model: str, prompt: str | list[int], max_tokens: int = 4) -> str:
    """A greedy completion from an OpenAI server or the router; its text."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    return str(post(f"{base}/v1/completions", body)["choices"][0]["text"])


def scrape(url: str) -> dict[str, float]:
    """A Prometheus text page as ``{'name{labels}': value}`` (comments skipped)."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                samples[name] = float(value)
            except ValueError:
                continue
    return samples


def routed(router: RouterSpec) -> dict[str, int]:
    """Requests the router sent to each worker so far (its per-worker successful outcomes)."""
    counts = dict.fromkeys(router.workers, 0)
    for name, value in scrape(router.metrics_url).items():
        if name.startswith("vllm_router_cb_outcomes_total{") and 'outcome="success"' in name:
            worker = name.split('worker="', 1)[1].split('"', 1)[0]
            counts[worker] = counts.get(worker, 0) + int(value)
    return counts


def connector_total(base: str, name: str) -> float:
    """A TierKVConnector counter of one replica (``tierkv_connector_<name>_total``, engines summed)."""
    prefix = f"tierkv_connector_{name}_total"
    return sum(v for k, v in scrape(f"{base}/metrics").items() if k.split("{", 1)[0] == prefix)


def reset_prefix_cache(base: str, timeout: float = 60.0) -> None:
    """Empty a replica's GPU prefix cache, once its pending stores are done (needs VLLM_SERVER_DEV_MODE)."""
    deadline = time.monotonic() + timeout
    while not post(f"{base}/reset_prefix_cache", {}).get("success"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base}: the prefix cache never became resettable")
        time.sleep(0.2)


REPLICA_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
"""A 1 GiB CPU KV cache, and the dev endpoints (``/reset_prefix_cache``) the tests and demo use."""


class LocalCluster:
    """``replicas`` vLLM servers with TierKVConnector on ``vaults`` shared vaults, and vllm-router.

    ``connector=False`` starts the replicas without the connector (and no vaults), the baseline;
    ``cold_events=False`` runs the connector without announcing the cold tier.
    Use as a context manager; :meth:`stop` stops everything started, in reverse order, by PID.
    """

    def __init__(
        self,
        state_dir: Path,
        model: str,
        *,
        served_name: str = "tiny",
        replicas: int = 2,
        vaults: int = 2,
        connector: bool = True,
        cold_events: bool = True,
        connector_extra: Mapping[str, Any] | None = None,
        policy: str = "kv_aware",
        block_size: int = 32,
        max_model_len: int = 1024,
        replica_args: Sequence[str] = ("--dtype", "float32", "--enforce-eager"),
        vault_bytes: str = "256MiB",
        router_args: Sequence[str] = (),
        start_timeout: float = 600.0,
    ) -> None:
        self.state_dir = state_dir
        self.model = model
        self.served_name = served_name
        self.n_replicas = replicas
        self.n_vaults = vaults if connector else 0
        self.policy = policy
        self.cold_events = cold_events
        self.connector_extra = tuple((connector_extra or {}).items())
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.replica_args = tuple(replica_args)
        self.vault_bytes = vault_bytes
        self.router_args = tuple(router_args)
        self.start_timeout = start_timeout
        self.vaults: list[VaultProcess] = []
        self.forwarders: list[Forwarder] = []
        self.replicas: list[tuple[ReplicaSpec, Process]] = []
        self.router: tuple[RouterSpec, Process] | None = None

    def start(self) -> LocalCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.n_vaults):
            self.vaults.append(VaultProcess(self.state_dir / f"vault{i}", max_bytes=self.vault_bytes).start())
        addresses = tuple(v.address for v in self.vaults)
        for i in range(self.n_replicas):
            forwarder = Forwarder(f"tcp://{LOOPBACK}:0", f"tcp://{LOOPBACK}:0").start()
            self.forwarders.append(forwarder)
            spec = ReplicaSpec(
                self.model,
                self.served_name,
                free_port(),
                forwarder.inbound,
                addresses,
                self.block_size,
                self.max_model_len,
                self.replica_args,
                f"tcp://{LOOPBACK}:{free_port()}",
                self.cold_events,
                self.connector_extra,
            )
            process = Process(f"replica{i}", spec.command(), self.state_dir / f"replica{i}.log", REPLICA_ENV)
            self.replicas.append((spec, process.start()))
        for spec, process in self.replicas:
            wait_healthy(f"{spec.url}/health", process, self.start_timeout)
        executable = router_executable()
        if executable is None:
            raise RuntimeError("vllm-router is not installed (scripts/setup-vllm-env.sh installs it)")
        workers = {
            spec.url: fwd.outbound for (spec, _), fwd in zip(self.replicas, self.forwarders, strict=True)
        }
        router = RouterSpec(
            free_port(),
            workers,
            self.served_name,
            self.policy,
            self.block_size,
            free_port(),
            self.router_args,
        )
        process = Process("router", router.command(executable), self.state_dir / "router.log")
        self.router = (router, process.start())
        wait_healthy(f"{router.url}/health", process, 60)

    def stop(self) -> None:
        if self.router is not None:
            self.router[1].stop()
        for _, process in reversed(self.replicas):
            process.stop()
        for forwarder in self.forwarders:
            forwarder.stop()
        for vault in reversed(self.vaults):
            vault.stop()
        self.router, self.replicas, self.forwarders, self.vaults = None, [], [], []

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
