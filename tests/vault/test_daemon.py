"""A real ``tierkv vault`` process: wire, limits, shutdown, persistence, auth, readiness, metrics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import lmdb
import pytest

from tests.conftest import VaultFactory
from tests.ports import free_port, refusing_port
from tests.processes import stopped
from tierkv import VaultClient
from tierkv.errors import AuthError, ResourceExhausted, VaultUnavailable
from tierkv.vault.store import full_key
from tierkv.wire import SERVICE


def test_roundtrip_is_bit_exact_across_frames(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    blobs = {f"k{i}".encode(): os.urandom(n) for i, n in enumerate([0, 1, 4096, 5 << 20, 9 << 20 | 7])}
    with VaultClient(v.address) as c:
        assert c.put(b"ns", blobs) == len(blobs)
        keys = [*blobs, b"absent"]
        assert c.get(b"ns", keys) == [*blobs.values(), None]
        assert c.prefix_lookup(b"ns", [b"k0", b"k1", b"absent", b"k2"]) == 2
        assert c.delete(b"ns", [b"k0", b"absent"]) == 1
        stats = c.stats()
        assert stats.keys == len(blobs) - 1
        assert stats.hits == len(blobs) and stats.misses == 1


def test_many_small_blobs_in_one_call(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    blobs = {i.to_bytes(4, "big"): os.urandom(100) for i in range(5000)}
    with VaultClient(v.address) as c:
        assert c.put(b"ns", blobs) == 5000
        assert c.get(b"ns", list(blobs)) == list(blobs.values())


def test_batch_over_the_vault_limit_is_an_error_not_an_empty_answer(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text('[vault]\nmax_batch_bytes = "1MiB"\n')
    v = vault_factory(extra_args=["--config", str(cfg)])
    with VaultClient(v.address) as c:
        with pytest.raises(ResourceExhausted, match=r"exceeds|more than"):
            c.put(b"ns", {b"big": os.urandom(2 << 20)})
        assert c.stats().keys == 0
        assert c.put(b"ns", {b"ok": b"fine"}) == 1


def test_client_message_limit_is_explicit(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with VaultClient(v.address, frame_bytes=8 << 20, max_message_bytes=1 << 20) as c:
        with pytest.raises(ResourceExhausted):
            c.put(b"ns", {b"k": os.urandom(4 << 20)})


@pytest.mark.parametrize("method", ["Put", "BatchGet", "PrefixLookup", "Delete", "Stats", "Flush"])
def test_garbage_is_invalid_argument_and_the_vault_keeps_serving(
    vault_factory: VaultFactory, method: str
) -> None:
    v = vault_factory(name=f"g-{method}")
    garbage = b"\xff\xfe\xfd" * 7
    with grpc.insecure_channel(v.address) as ch:
        path = f"/{SERVICE}/{method}"
        ident = lambda b: b
        with pytest.raises(grpc.RpcError) as info:
            if method == "Put":
                ch.stream_unary(path, ident, ident)(iter([garbage]), timeout=5)
            elif method == "BatchGet":
                list(ch.unary_stream(path, ident, ident)(garbage, timeout=5))
            else:
                ch.unary_unary(path, ident, ident)(garbage, timeout=5)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with VaultClient(v.address) as c:
        assert c.put(b"ns", {b"k": b"v"}) == 1
        assert c.get(b"ns", [b"k"]) == [b"v"]


def test_second_vault_on_a_taken_port_refuses_to_start(vault_factory: VaultFactory) -> None:
    first = vault_factory(name="first")
    second = vault_factory(name="second", port=first.port, start=False)
    with pytest.raises(RuntimeError, match=r"exited with 3[\s\S]*cannot bind"):
        second.start(timeout=20)
    with VaultClient(first.address) as c:
        assert c.health()


def test_token_is_required_when_configured(vault_factory: VaultFactory) -> None:
    v = vault_factory(env={"TIERKV_TOKEN": "s3cret-token"})
    with VaultClient(v.address) as anonymous:
        with pytest.raises(AuthError):
            anonymous.stats()
        with pytest.raises(AuthError):
            anonymous.get(b"ns", [b"k"])
        assert anonymous.health(), "health checks stay open for probes"
    with VaultClient(v.address, token="wrong") as wrong, pytest.raises(AuthError):
        wrong.put(b"ns", {b"k": b"v"})
    with VaultClient(v.address, token="s3cret-token") as good:
        assert good.put(b"ns", {b"k": b"v"}) == 1


def test_graceful_shutdown_exits_zero_and_keeps_data(vault_factory: VaultFactory) -> None:
    v = vault_factory(sync="fast")
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"k": b"kept"})
    assert v.stop() == 0
    assert "vault stopped" in v.log_tail()
    again = vault_factory(name=v.path.name)
    with VaultClient(again.address) as c:
        assert c.get(b"ns", [b"k"]) == [b"kept"]


def _flip_on_disk(path: Path, db: bytes, fkey: bytes, offset: int, bits: int) -> None:
    """Flip ``bits`` of byte ``offset`` of ``fkey``'s record in database ``db`` of a stopped vault's LMDB,
    as damage on disk would (written through LMDB, so the file itself stays readable)."""
    env = lmdb.open(str(path), max_dbs=4)
    records = env.open_db(db)
    with env.begin(write=True) as txn:
        raw = bytearray(txn.get(fkey, db=records))
        raw[offset] ^= bits
        txn.put(fkey, bytes(raw), db=records)
    env.close()


def test_flipped_byte_on_disk_is_reported_corrupt(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"a": b"A" * 10_000, b"b": b"B" * 10_000})
    assert v.stop() == 0
    _flip_on_disk(v.path, b"data", full_key(b"ns", b"a"), 5000, 0xFF)
    again = vault_factory(name=v.path.name)
    with VaultClient(again.address) as c:
        assert c.get(b"ns", [b"a", b"b"]) == [None, b"B" * 10_000]
        assert c.stats().corrupt == 1
        assert c.get(b"ns", [b"a"]) == [None]
        assert c.stats().corrupt == 1, "a corrupt entry is dropped, not reported twice"


def test_a_damaged_charge_on_disk_does_not_stop_the_vault_storing(vault_factory: VaultFactory) -> None:
    """An index record whose charge field was flipped to 2^63 (the checksum covers the blob, not the
    record): replacing or evicting that entry took the bogus charge off the totals, which went negative,
    and every Put touching it failed INTERNAL, so a full vault stopped storing for good."""
    v = vault_factory(max_bytes="4MiB")
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"a": b"A" * 10_000, b"b": b"B" * 10_000})
    assert v.stop() == 0
    _flip_on_disk(v.path, b"index", full_key(b"ns", b"a"), 7, 0x80)  # the top bit of the charge (LE)
    again = vault_factory(name=v.path.name, max_bytes="4MiB")
    with VaultClient(again.address) as c:
        assert c.put(b"ns", {b"a": b"a" * 10_000}) == 1, "replacing the damaged entry"
        assert c.get(b"ns", [b"a", b"b"]) == [b"a" * 10_000, b"B" * 10_000]
        for i in range(40):  # ten times the budget: b and everything early is evicted
            assert c.put(b"ns", {f"fill{i}".encode(): os.urandom(1 << 20)}) == 1, f"put {i}"
        stats = c.stats()
        assert 0 < stats.used_bytes <= 4 << 20 and stats.keys >= 1
    assert "Traceback" not in again.log_tail(200)


def test_a_damaged_lmdb_page_under_a_blob_is_a_miss_and_the_rest_is_served(
    vault_factory: VaultFactory,
) -> None:
    """The header of the overflow page that holds a blob overwritten in data.mdb itself (not through
    LMDB): LMDB refuses the read (MDB_CORRUPTED). That key is a miss, the other keys and later calls are
    served, no call ends INTERNAL, and the full vault keeps storing."""
    v = vault_factory(max_bytes="4MiB")
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"a": b"A" * 10_000, b"b": b"B" * 10_000})
    assert v.stop() == 0
    data_file = v.path / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    at = raw.find(b"A" * 4000)
    page = at - at % 4096
    assert page > 0 and at - page == 16, "the blob starts right after its overflow page's header"
    raw[page : page + 16] = b"\xee" * 16
    data_file.write_bytes(raw)
    again = vault_factory(name=v.path.name, max_bytes="4MiB")
    for bulk in (True, False):
        with VaultClient(again.address, bulk=bulk) as c:
            assert c.get(b"ns", [b"a", b"b"]) == [None, b"B" * 10_000]
            assert c.put(b"ns", {b"c": b"C" * 100}) == 1
            assert c.get(b"ns", [b"c"]) == [b"C" * 100]
    with VaultClient(again.address) as c:
        for i in range(16):  # four times the budget: eviction never picks the entry it cannot delete
            assert c.put(b"ns", {f"fill{i}".encode(): os.urandom(1 << 20)}) == 1, f"put {i}"
        assert c.get(b"ns", [b"fill15"]) != [None]
    assert again.stop() == 0
    log = again.log_file.read_text()
    assert "Traceback" not in log and "INTERNAL" not in log
    assert "damaged" in log


def test_unreachable_vault_raises_unavailable_within_the_deadline() -> None:
    with refusing_port() as port, VaultClient(f"127.0.0.1:{port}", timeout=0.5) as c:
        start = time.monotonic()
        with pytest.raises(VaultUnavailable):
            c.get(b"ns", [b"k"])
        assert time.monotonic() - start < 5


def test_stalled_vault_raises_unavailable_not_a_hang(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with stopped(v), VaultClient(v.address, timeout=0.5) as c:
        start = time.monotonic()
        with pytest.raises(VaultUnavailable):
            c.prefix_lookup(b"ns", [b"k"])
        assert time.monotonic() - start < 5


def test_systemd_readiness_is_sent_once_serving(vault_factory: VaultFactory, tmp_path: Path) -> None:
    sock_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(sock_path))
        sock.settimeout(20)
        v = vault_factory(env={"NOTIFY_SOCKET": str(sock_path)})
        assert sock.recv(100) == b"READY=1"
        with VaultClient(v.address) as c:
            assert c.health()
        v.stop()
        assert sock.recv(100) == b"STOPPING=1"


def test_prometheus_metrics_are_served(vault_factory: VaultFactory) -> None:
    port = free_port()
    v = vault_factory(extra_args=["--metrics-port", str(port)])
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"k": b"x" * 1000})
        c.get(b"ns", [b"k", b"missing"])
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "tierkv_vault_hits_total 1.0" in text
    assert "tierkv_vault_misses_total 1.0" in text
    assert "tierkv_vault_bytes_in_total 1000.0" in text
    assert 'tierkv_vault_requests_total{code="OK",method="Put"} 1.0' in text
    assert "tierkv_vault_request_seconds_bucket" in text


def test_vault_without_configuration_uses_defaults(tmp_path: Path) -> None:
    """No flags, no file: port 50051 on 127.0.0.1 under the user's data dir (here a temp HOME)."""
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": "", "TIERKV_CONFIG": ""}
    code = (
        "from tierkv.config import load_config; c = load_config(); "
        "print(c.vault.host, c.vault.port, c.vault.resolved_path())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.split() == ["127.0.0.1", "50051", str(tmp_path / ".local/share/tierkv/vault-50051")]
