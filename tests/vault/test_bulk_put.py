"""Put over the bulk port (tierkv-bulk/1 operation 2) of a real vault process: protocol, auth, garbage,
slow senders and the in-flight budget."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import grpc

from tests.conftest import VaultFactory
from tests.vault.rawcalls import bulk_records, read_records, stats
from tierkv import VaultClient
from tierkv.vault.launcher import VaultProcess
from tierkv.wire import Blob, bulk, pb
from tierkv.wire.framing import encode_frames


def put_request(blobs: dict[bytes, bytes], *, token: str | None = None, namespace: bytes = b"ns") -> bytes:
    """A whole Put request as the documented records: head, token, FRAME records, END."""
    frames = encode_frames(
        [Blob(key=k, data=v) for k, v in blobs.items()], frame_bytes=1 << 20, namespace=namespace
    )
    records = [bulk.record(bulk.FRAME, len(f)) + f for f in frames]
    return b"".join([bulk.request_head(token, bulk.OP_PUT), *records, bulk.record(bulk.END, 0)])


def bulk_port(address: str, token: str | None = None) -> int:
    with grpc.insecure_channel(address) as ch:
        reply = stats(ch, token)
    assert reply.bulk_port and reply.bulk_put, "a vault with a bulk port says it takes Put there"
    return reply.bulk_port


def configured(vault_factory: VaultFactory, tmp_path: Path, config: str) -> tuple[VaultProcess, int]:
    """A vault started with ``config`` as its TOML file, and its bulk port."""
    path = tmp_path / "vault.toml"
    path.write_text(config)
    v = vault_factory(extra_args=["--config", str(path)])
    return v, bulk_port(v.address)


def test_put_over_the_bulk_port_speaks_the_documented_protocol(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    port = bulk_port(v.address)
    blobs = {b"a": os.urandom(100), b"big": os.urandom(3 << 20), b"empty": b""}
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(put_request(blobs))
        (kind, payload), end = read_records(sock)
        assert kind == bulk.FRAME and end == (bulk.END, b"")
        assert pb.PutReply.FromString(payload).stored == 3
        get = pb.BatchGetRequest(namespace=b"ns", keys=[b"big"]).SerializeToString()
        sock.sendall(bulk.encode_request(None, get))  # the connection takes the next request
        assert read_records(sock)[-1] == (bulk.END, b"")
    with VaultClient(v.address) as c:
        assert c.get(b"ns", list(blobs)) == list(blobs.values())


def test_garbage_in_a_bulk_put_is_invalid_argument_and_stores_nothing(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    port = bulk_port(v.address)
    head = bulk.request_head(None, bulk.OP_PUT)
    not_a_frame = b"\xff\xfe\xfd" * 5
    cases = {
        "client sends an ERROR record": head + bulk.record(bulk.ERROR, 2) + b"no",
        "a frame that is no Frame": head + bulk.record(bulk.FRAME, len(not_a_frame)) + not_a_frame,
        "an END that claims a payload": head + bulk.record(bulk.END, 3) + b"abc",
    }
    for why, request in cases.items():
        [(kind, payload)] = bulk_records(port, request)
        assert kind == bulk.ERROR and bulk.parse_error(payload)[0] == "INVALID_ARGUMENT", why
    cut = put_request({b"cut": os.urandom(1 << 20)})[: -(1 << 19)]
    assert bulk_records(port, cut, half_close=True)[-1][0] == bulk.ERROR
    with VaultClient(v.address) as c:
        assert c.get(b"ns", [b"cut"]) == [None], "a Put cut short stored nothing"
        c.put(b"ns", {b"k": b"v"})
        assert c.get(b"ns", [b"k"]) == [b"v"], "the vault kept serving"


def test_bulk_put_requires_the_token_before_reading_any_frame(vault_factory: VaultFactory) -> None:
    v = vault_factory(env={"TIERKV_TOKEN": "s3cret"})
    port = bulk_port(v.address, token="s3cret")
    [(kind, payload)] = bulk_records(port, put_request({b"k": b"v"}, token="wrong"))
    assert kind == bulk.ERROR and bulk.parse_error(payload)[0] == "UNAUTHENTICATED"
    with VaultClient(v.address, token="s3cret") as c:
        assert c.get(b"ns", [b"k"]) == [None]


def test_a_stalled_bulk_put_never_holds_up_other_writers(vault_factory: VaultFactory) -> None:
    """A sender that stops halfway through a frame holds only its own bytes: the store is written only
    once a Put's frames are all in, so other Puts (bulk and gRPC) and reads go on."""
    v = vault_factory()
    port = bulk_port(v.address)
    request = put_request({b"stalled": os.urandom(2 << 20)})
    with socket.create_connection(("127.0.0.1", port), timeout=30) as stalled:
        stalled.sendall(request[: 1 << 20])
        time.sleep(0.2)  # the vault reads the first half (a socket, no timer of its own)
        with VaultClient(v.address, timeout=10) as c:
            start = time.monotonic()
            for i in range(5):
                c.put(b"ns", {f"k{i}".encode(): os.urandom(1 << 20)})
            assert time.monotonic() - start < 8
            assert c.get(b"ns", [b"stalled"]) == [None]
            assert all(c.get(b"ns", [f"k{i}".encode() for i in range(5)]))
        stalled.sendall(request[1 << 20 :])
        (kind, payload), _ = read_records(stalled)
        assert kind == bulk.FRAME and pb.PutReply.FromString(payload).stored == 1


def test_a_put_past_the_in_flight_budget_is_refused_then_sent_over_grpc(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    v, port = configured(vault_factory, tmp_path, '[vault]\nbulk_max_inflight_bytes = "1MiB"\n')
    records = bulk_records(port, put_request({b"big": os.urandom(3 << 20)}))
    assert records[-1][0] == bulk.ERROR and bulk.parse_error(records[-1][1])[0] == "RESOURCE_EXHAUSTED"
    blob = os.urandom(32 << 20)  # far more than socket buffers hold: the client is still sending when refused
    with VaultClient(v.address) as c:
        assert c.put(b"ns", {b"big": blob}) == 1
        assert c.get(b"ns", [b"big"]) == [blob]
        assert c.bulk_port == port, "a refused Put does not take BatchGet off the bulk port"


def test_a_bulk_put_frame_over_the_vaults_message_limit_is_refused(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    _, port = configured(
        vault_factory, tmp_path, '[vault]\nmax_message_bytes = "1MiB"\nframe_bytes = "256KiB"\n'
    )
    frame = next(encode_frames([Blob(key=b"k", data=os.urandom(2 << 20))], frame_bytes=4 << 20))
    request = bulk.request_head(None, bulk.OP_PUT) + bulk.record(bulk.FRAME, len(frame)) + frame
    records = bulk_records(port, request)
    assert records[-1][0] == bulk.ERROR
    code, details = bulk.parse_error(records[-1][1])
    assert code == "RESOURCE_EXHAUSTED" and "max_message_bytes" in details
