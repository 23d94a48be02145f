"""The bulk data plane (tierkv-bulk/1) of a real vault process: protocol, auth, garbage, fallbacks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import VaultFactory
from tests.processes import stopped
from tests.vault.rawcalls import bulk_records
from tierkv import VaultClient
from tierkv.errors import AuthError, VaultUnavailable
from tierkv.wire import FrameDecoder, bulk, pb


def test_bulk_port_speaks_the_documented_protocol(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    blobs = {b"a": os.urandom(100), b"big": os.urandom(9 << 20)}
    with VaultClient(v.address, timeout=30) as c:  # about the protocol, not deadlines: a busy machine is fine
        c.put(b"ns", blobs)
        port = c.stats().bulk_port
    assert port > 0
    request = pb.BatchGetRequest(namespace=b"ns", keys=[b"a", b"gone", b"big"]).SerializeToString()
    records = bulk_records(port, bulk.encode_request(None, request))
    assert records[-1] == (bulk.END, b"")
    decoder = FrameDecoder(max_item_bytes=1 << 30)
    got = {}
    for kind, payload in records[:-1]:
        assert kind == bulk.FRAME
        for blob in decoder.feed(payload):
            got[blob.key] = (blob.status, None if blob.data is None else bytes(blob.data))
    assert got == {
        b"a": (pb.FOUND, blobs[b"a"]),
        b"gone": (pb.MISSING, None),
        b"big": (pb.FOUND, blobs[b"big"]),
    }


def test_client_uses_the_bulk_port_by_default(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"k": b"v"})
        assert c.get(b"ns", [b"k"]) == [b"v"]
        assert c.bulk_port == c.stats().bulk_port
        assert c.stats().bulk_put


@pytest.mark.parametrize(
    "garbage",
    [b"GET / HTTP/1.1\r\n\r\n", b"\x00" * 10, bulk.encode_request(None, b"\xff\xfe\xfd" * 5)],
)
def test_garbage_on_the_bulk_port_is_invalid_argument(vault_factory: VaultFactory, garbage: bytes) -> None:
    v = vault_factory()
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"k": b"v"})
        port = c.stats().bulk_port
    [(kind, payload)] = bulk_records(port, garbage)
    assert kind == bulk.ERROR and bulk.parse_error(payload)[0] == "INVALID_ARGUMENT"
    with VaultClient(v.address) as c:
        assert c.get(b"ns", [b"k"]) == [b"v"]
        assert c.bulk_port is not None


def test_bulk_port_requires_the_token(vault_factory: VaultFactory) -> None:
    v = vault_factory(env={"TIERKV_TOKEN": "s3cret"})
    with VaultClient(v.address, token="s3cret") as c:
        c.put(b"ns", {b"k": b"v"})
        port = c.stats().bulk_port
        assert c.get(b"ns", [b"k"]) == [b"v"] and c.bulk_port is not None
    request = pb.BatchGetRequest(namespace=b"ns", keys=[b"k"]).SerializeToString()
    [(kind, payload)] = bulk_records(port, bulk.encode_request("wrong", request))
    assert kind == bulk.ERROR and bulk.parse_error(payload)[0] == "UNAUTHENTICATED"
    with VaultClient(v.address, token="s3cret") as c:
        assert c.get(b"ns", [b"k"]) == [b"v"]
        channel = getattr(c.transport, "bulk", None)
        assert channel is not None
        channel._token = "wrong"
        with pytest.raises(AuthError):
            c.get(b"ns", [b"k"])


def test_without_a_bulk_port_batch_get_stays_on_grpc(vault_factory: VaultFactory, tmp_path: Path) -> None:
    cfg = tmp_path / "nobulk.toml"
    cfg.write_text("[vault]\nbulk = false\n")
    v = vault_factory(extra_args=["--config", str(cfg)])
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"k": b"v" * 1000})
        assert c.stats().bulk_port == 0 and not c.stats().bulk_put
        assert c.get(b"ns", [b"k"]) == [b"v" * 1000]
        assert c.bulk_port is None


def test_stalled_vault_is_unavailable_on_the_bulk_path_too(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with VaultClient(v.address, timeout=0.5) as c:
        c.put(b"ns", {b"k": b"v"})
        assert c.get(b"ns", [b"k"]) == [b"v"]
        with stopped(v):
            start = time.monotonic()
            with pytest.raises(VaultUnavailable):
                c.get(b"ns", [b"k"])
            assert time.monotonic() - start < 5


def test_restarted_vault_is_read_again_through_a_fallback(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"k": b"kept"})
        assert c.get(b"ns", [b"k"]) == [b"kept"] and c.bulk_port is not None
        assert v.stop() == 0
        again = vault_factory(name=v.path.name, port=v.port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                assert c.get(b"ns", [b"k"]) == [b"kept"]
                break
            except VaultUnavailable:
                time.sleep(0.1)
        else:
            pytest.fail("the restarted vault was not read again")
        assert again.stop() == 0


def test_graceful_stop_with_an_idle_bulk_connection_open(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"k": b"v"})
        assert c.get(b"ns", [b"k"]) == [b"v"]
        start = time.monotonic()
        assert v.stop() == 0
        assert time.monotonic() - start < 10
