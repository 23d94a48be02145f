"""A bound ZMQ forwarder for vLLM's KV event stream.

vLLM's publisher binds only a wildcard endpoint (``tcp://*:PORT``, every interface) and otherwise
connects out. To keep events on one interface (loopback in tests and single-host clusters, a private
address in a deployment) give vLLM ``tcp://127.0.0.1:IN`` to connect to, and point every consumer
(vllm-router ``--kv-event-source``, ``tierkv pages``) at ``tcp://127.0.0.1:OUT``. Both ends are bound
here: an XSUB socket that publishers connect to and an XPUB socket that subscribers connect to, joined
by ``zmq.proxy`` so subscriptions travel upstream and messages downstream unchanged (topic, sequence
number, payload).

Run one per replica so the router can tell the replicas apart::

    python -m tierkv.routing.forward tcp://127.0.0.1:5557 tcp://127.0.0.1:5558
"""

from __future__ import annotations

import argparse
import logging
import threading
from types import TracebackType

import zmq

log = logging.getLogger(__name__)


class Forwarder:
    """XSUB (``inbound``, publishers connect) → XPUB (``outbound``, subscribers connect), in a thread.

    A port of 0 binds a free port; :attr:`inbound` and :attr:`outbound` then name the bound ones.
    """

    def __init__(self, inbound: str, outbound: str) -> None:
        self._ctx = zmq.Context()
        self._xsub = self._ctx.socket(zmq.XSUB)
        self._xpub = self._ctx.socket(zmq.XPUB)
        self._control = self._ctx.socket(zmq.PAIR)
        self._stop = self._ctx.socket(zmq.PAIR)
        try:
            self.inbound = _bind(self._xsub, inbound)
            self.outbound = _bind(self._xpub, outbound)
        except zmq.ZMQError:
            self._close()
            raise
        control = f"inproc://forward-control-{id(self)}"
        self._control.bind(control)
        self._stop.connect(control)
        self._thread = threading.Thread(target=self._run, name="kv-event-forwarder", daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()
        log.info("forwarding KV events %s -> %s", self.inbound, self.outbound)
        return self

    def _run(self) -> None:
        try:
            zmq.proxy_steerable(self._xsub, self._xpub, None, self._control)
        except zmq.ZMQError as exc:  # the context closed under the proxy
            log.debug("forwarder stopped: %s", exc)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.send(b"TERMINATE")
            self._thread.join(timeout=5)
        self._close()

    def _close(self) -> None:
        for sock in (self._xsub, self._xpub, self._control, self._stop):
            sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> Forwarder:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


def _bind(sock: zmq.Socket[bytes], endpoint: str) -> str:
    """Bind ``endpoint`` (port 0 picks a free one); the endpoint actually bound."""
    if endpoint.endswith(":0"):
        port = sock.bind_to_random_port(endpoint[: -len(":0")])
        return f"{endpoint[: -len(':0')]}:{port}"
    sock.bind(endpoint)
    return endpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tierkv.routing.forward", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "inbound", help="endpoint the engine's publisher connects to, e.g. tcp://127.0.0.1:5557"
    )
    parser.add_argument("outbound", help="endpoint routers subscribe to, e.g. tcp://127.0.0.1:5558")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        forwarder = Forwarder(args.inbound, args.outbound).start()
    except zmq.ZMQError as exc:
        parser.error(f"cannot bind {args.inbound} / {args.outbound}: {exc}")  # exits 2
    print(f"inbound {forwarder.inbound} outbound {forwarder.outbound}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        forwarder.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
