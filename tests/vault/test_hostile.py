"""Hostile and careless peers against a real vault: fuzzed calls on every method and on the bulk port,
bodies declared but never sent, rejected calls in the log, signals."""

from __future__ import annotations

import json
import random
import signal
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.conftest import VaultFactory
from tests.vault.rawcalls import bulk_records, code_of, get, put, stats, unary
from tierkv.wire import SERVICE, Blob, bulk, encode_frames, pb

EXPECTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
}
METHODS = ["Put", "BatchGet", "PrefixLookup", "Delete", "Stats", "Flush"]


def mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randrange(1, 6)):
        op = rng.random()
        if op < 0.4 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif op < 0.6:
            data[rng.randrange(len(data) + 1) :] = rng.randbytes(rng.randrange(0, 12))
        elif op < 0.8 and data:
            del data[rng.randrange(len(data)) :]
        else:
            pos = rng.randrange(len(data) + 1)
            data[pos:pos] = rng.randbytes(rng.randrange(1, 8))
    return bytes(data)


def seeds() -> dict[str, bytes]:
    frame = next(iter(encode_frames([Blob(key=b"k", data=b"v" * 40)], frame_bytes=1 << 20, namespace=b"ns")))
    keyed = pb.BatchGetRequest(namespace=b"ns", keys=[b"k", b"j"]).SerializeToString()
    return {
        "Put": frame,
        "BatchGet": keyed,
        "PrefixLookup": keyed,
        "Delete": pb.DeleteRequest(namespace=b"zz", keys=[b"q"]).SerializeToString(),
        "Stats": b"",
        "Flush": pb.FlushRequest(namespace=b"zz").SerializeToString(),
    }


def call(ch: grpc.Channel, method: str, payload: bytes) -> grpc.StatusCode:
    path, ident = f"/{SERVICE}/{method}", (lambda b: b)
    if method == "Put":
        return code_of(ch.stream_unary(path, ident, ident), iter([payload]), timeout=10)
    if method == "BatchGet":
        return code_of(lambda: list(ch.unary_stream(path, ident, ident)(payload, timeout=10)))
    return code_of(ch.unary_unary(path, ident, ident), payload, timeout=10)


def test_fuzzed_calls_get_only_expected_codes_and_the_vault_keeps_serving(
    vault_factory: VaultFactory,
) -> None:
    v = vault_factory()
    rng = random.Random(20240610)
    start, calls = time.monotonic(), 0
    with grpc.insecure_channel(v.address) as ch:
        put(ch, b"keep", {b"k": b"kept"})
        for round_ in range(60):
            for method, seed in seeds().items():
                code = call(ch, method, mutate(rng, seed))
                assert code in EXPECTED, f"{method} round {round_}: {code}"
                calls += 1
            if time.monotonic() - start > 60:
                break
        assert get(ch, b"keep", [b"k"]) == [b"kept"], "a fuzzed call lost data"
    port = None
    with grpc.insecure_channel(v.address) as ch:
        port = stats(ch).bulk_port
    request = bulk.encode_request(
        None, pb.BatchGetRequest(namespace=b"keep", keys=[b"k"]).SerializeToString()
    )
    frame = seeds()["Put"]
    put_request = b"".join(
        [
            bulk.request_head(None, bulk.OP_PUT),
            bulk.record(bulk.FRAME, len(frame)),
            frame,
            bulk.record(bulk.END, 0),
        ]
    )
    lookup = bulk.encode_request(
        None,
        pb.PrefixLookupRequest(namespace=b"keep", keys=[b"k"], lease_ms=100).SerializeToString(),
        bulk.OP_PREFIX_LOOKUP,
    )
    for i in range(300):
        records = bulk_records(port, mutate(rng, (put_request, request, lookup)[i % 3]), half_close=True)
        for kind, payload in records:
            assert kind in (bulk.FRAME, bulk.END, bulk.ERROR)
            if kind == bulk.ERROR:
                assert bulk.parse_error(payload)[0] in {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}, payload
    with grpc.insecure_channel(v.address) as ch:
        assert get(ch, b"keep", [b"k"]) == [b"kept"]
    assert calls >= 60
    assert v.stop() == 0
    log = v.log_file.read_text()
    assert "Traceback" not in log and "INTERNAL" not in log


def test_rejections_are_logged_as_counts_not_one_line_each(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with grpc.insecure_channel(v.address) as ch:
        for _ in range(200):
            assert code_of(unary, ch, "Delete", b"\xff\xfe\xfd") is grpc.StatusCode.INVALID_ARGUMENT
    assert v.stop() == 0
    lines = [line for line in v.log_file.read_text().splitlines() if "reject" in line]
    assert 1 <= len(lines) <= 3, lines
    assert "200" in lines[-1] and "Delete INVALID_ARGUMENT" in lines[-1]


@pytest.mark.parametrize("op", ["BatchGet", "Put"])
def test_declared_bodies_without_bytes_hold_no_memory(vault_factory: VaultFactory, op: str) -> None:
    """32 connections each declare a 64 MiB BatchGet body or Put frame and send 1 KiB of it (no token set)."""
    v = vault_factory()
    with grpc.insecure_channel(v.address) as ch:
        port = stats(ch).bulk_port
    assert v.proc is not None
    before = rss_bytes(v.proc.pid)
    socks = []
    if op == "Put":
        declared = bulk.request_head(None, bulk.OP_PUT) + bulk.record(bulk.FRAME, 64 << 20)
    else:
        head = bulk.REQUEST_HEAD.pack(bulk.MAGIC, bulk.VERSION, bulk.OP_BATCH_GET, 0)
        declared = head + struct.pack("<I", 64 << 20)
    try:
        for _ in range(32):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(declared + b"\x0a" * 1024)
            socks.append(s)
        time.sleep(1.0)  # the vault's connection threads read what was sent (a socket; no timer of its own)
        grown = rss_bytes(v.proc.pid) - before
        with grpc.insecure_channel(v.address) as ch:
            put(ch, b"ns", {b"k": b"v"})
            assert get(ch, b"ns", [b"k"]) == [b"v"]
    finally:
        for s in socks:
            s.close()
    assert grown < 128 << 20, f"vault RSS grew by {grown >> 20} MiB"


def test_sighup_takes_the_graceful_path(vault_factory: VaultFactory) -> None:
    v = vault_factory(sync="fast")
    with grpc.insecure_channel(v.address) as ch:
        put(ch, b"ns", {b"k": b"kept"})
    assert v.proc is not None
    v.proc.send_signal(signal.SIGHUP)
    assert v.proc.wait(20) == 0
    assert "SIGHUP" in v.log_tail() and "vault stopped" in v.log_tail()
    again = vault_factory(name=v.path.name)
    with grpc.insecure_channel(again.address) as ch:
        assert get(ch, b"ns", [b"k"]) == [b"kept"]


def test_startup_line_is_json_and_metrics_carry_build_info(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    cfg = tmp_path / "json.toml"
    cfg.write_text(f'[log]\njson = true\n[vault]\nmetrics_port = {metrics_port}\npolicy = "priority-lru"\n')
    v = vault_factory(role="ssm_cold", extra_args=["--config", str(cfg)])
    facts = [json.loads(line) for line in v.log_file.read_text().splitlines() if '"vault_serving"' in line]
    assert facts, v.log_tail()
    line = facts[-1] if "msg" not in facts[-1] else json.loads(facts[-1]["msg"])
    assert line["role"] == "ssm_cold" and line["policy"] == "priority-lru"
    assert line["version"] and line["metrics"].endswith(f":{metrics_port}")
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    assert 'tierkv_vault_build_info{role="ssm_cold",version="' in body


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("policy", ["adaptive", "lru"])
def test_a_key_given_twice_in_one_put_holds_its_last_blob(
    vault_factory: VaultFactory, tmp_path: Path, policy: str
) -> None:
    """The adaptive policy writes a Put deepest block first (in reverse): a key sent twice kept its
    first blob, while the reply acknowledged the second as stored too."""
    cfg = tmp_path / "policy.toml"
    cfg.write_text(f'[vault]\npolicy = "{policy}"\n')
    v = vault_factory(extra_args=["--config", str(cfg)])
    blobs = [Blob(key=b"x", data=b"first"), Blob(key=b"y", data=b"y"), Blob(key=b"x", data=b"second")]
    ident = lambda b: b
    with grpc.insecure_channel(v.address) as ch:
        frames = encode_frames(blobs, frame_bytes=1 << 20, namespace=b"ns")
        reply = pb.PutReply.FromString(ch.stream_unary(f"/{SERVICE}/Put", ident, ident)(frames, timeout=10))
        assert (reply.stored, reply.rejected) == (3, 0)
        assert get(ch, b"ns", [b"x", b"y"]) == [b"second", b"y"]
        assert stats(ch).keys == 2


def test_a_put_stream_cut_by_grpc_is_a_quiet_cancel_not_an_internal_error(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    """gRPC ends a client-streaming Put under the vault when a message is over max_message_bytes or the
    client cancels; the frames iterator then raises grpc.RpcError, which was logged with a traceback
    and counted as 'Put INTERNAL'."""
    cfg = tmp_path / "small.toml"
    cfg.write_text('[vault]\nmax_message_bytes = "64KiB"\nframe_bytes = "16KiB"\n')
    v = vault_factory(extra_args=["--config", str(cfg)])
    ident = lambda b: b
    frame = next(iter(encode_frames([Blob(key=b"k", data=b"v")], frame_bytes=1 << 20, namespace=b"ns")))
    release = threading.Event()

    def stalled() -> Iterator[bytes]:
        yield frame
        release.wait(10)

    with grpc.insecure_channel(v.address, options=[("grpc.max_send_message_length", -1)]) as ch:
        put_call = ch.stream_unary(f"/{SERVICE}/Put", ident, ident)
        for _ in range(3):
            assert code_of(put_call, iter([frame, b"\x0a" * (1 << 20)]), timeout=10) in (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.CANCELLED,
            )
            pending = put_call.future(stalled(), timeout=10)
            time.sleep(0.2)  # the vault reads the first frame and waits for the next (a socket)
            pending.cancel()
            release.set()
            release.clear()
        put(ch, b"ns", {b"k": b"kept"})
        assert get(ch, b"ns", [b"k"]) == [b"kept"]
    assert v.stop() == 0
    log = v.log_file.read_text()
    assert "Traceback" not in log and "INTERNAL" not in log, log
