"""The bound KV event forwarder: a publisher that connects in reaches every subscriber that connects
to the other side, frames unchanged; stopping releases both ports; a bad endpoint is an error."""

from __future__ import annotations

import time

import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq comes with vLLM (make test-vllm builds .venv-vllm)")

from tierkv.routing import forward  # noqa: E402
from tierkv.routing.forward import Forwarder  # noqa: E402

pytestmark = [pytest.mark.vllm]


def test_frames_pass_unchanged_to_every_subscriber_and_stop_frees_the_ports() -> None:
    ctx = zmq.Context()
    with Forwarder("tcp://127.0.0.1:0", "tcp://127.0.0.1:0") as forwarder:
        subs = []
        for _ in range(2):
            sub = ctx.socket(zmq.SUB)
            sub.connect(forwarder.outbound)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            subs.append(sub)
        pub = ctx.socket(zmq.PUB)
        pub.connect(forwarder.inbound)
        frames = [b"", (7).to_bytes(8, "big"), b"\x93payload"]
        deadline = time.monotonic() + 10
        while not all(s.poll(50) for s in subs):  # subscriptions travel upstream asynchronously
            assert time.monotonic() < deadline, "nothing reached the subscribers"
            pub.send_multipart(frames)
        for sub in subs:
            assert sub.recv_multipart() == frames
            sub.close(0)
        pub.close(0)
        inbound, outbound = forwarder.inbound, forwarder.outbound
    ctx.term()
    again = Forwarder(inbound, outbound)  # both ports free again
    again.stop()


def test_a_bad_endpoint_is_an_error() -> None:
    with pytest.raises(zmq.ZMQError):
        Forwarder("tcp://127.0.0.1:0", "nonsense://x")


def test_the_command_names_a_bad_endpoint_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        forward.main(["garbage", "tcp://127.0.0.1:0"])
    assert exited.value.code == 2 and "cannot bind garbage" in capsys.readouterr().err
