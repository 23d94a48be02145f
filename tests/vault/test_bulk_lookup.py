"""PrefixLookup over the bulk port (tierkv-bulk/1 operation 3), against real vault processes."""

from __future__ import annotations

import socket

import grpc

from tests.conftest import VaultFactory
from tests.vault.rawcalls import bulk_records, read_records, stats
from tierkv import VaultClient
from tierkv.wire import bulk, pb


def lookup_request(keys: list[bytes], *, token: str | None = None, lease_ms: int = 0) -> bytes:
    body = pb.PrefixLookupRequest(namespace=b"ns", keys=keys, lease_ms=lease_ms).SerializeToString()
    return bulk.encode_request(token, body, bulk.OP_PREFIX_LOOKUP)


def lookup_port(address: str, token: str | None = None) -> int:
    with grpc.insecure_channel(address) as ch:
        reply = stats(ch, token)
    assert reply.bulk_port and reply.bulk_lookup, "a vault with a bulk port answers lookups there"
    return reply.bulk_port


def test_prefix_lookup_over_the_bulk_port_speaks_the_documented_protocol(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    port = lookup_port(v.address)
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"a": b"1", b"b": b"2", b"d": b"4"})
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(lookup_request([b"a", b"b", b"c", b"d"], lease_ms=5000))
        (kind, payload), end = read_records(sock)
        assert kind == bulk.FRAME and end == (bulk.END, b"")
        assert pb.PrefixLookupReply.FromString(payload).count == 2
        sock.sendall(lookup_request([b"d"]))  # the connection takes the next request
        (_, payload), _ = read_records(sock)
        assert pb.PrefixLookupReply.FromString(payload).count == 1
    with VaultClient(v.address) as c:
        leases = c.stats().leases
        assert leases is not None and leases.granted == 2, "the lease was granted as over gRPC"


def test_garbage_in_a_bulk_lookup_is_invalid_argument_and_the_token_comes_first(
    vault_factory: VaultFactory,
) -> None:
    v = vault_factory(env={"TIERKV_TOKEN": "s3cret"})
    port = lookup_port(v.address, token="s3cret")
    head = bulk.request_head("s3cret", bulk.OP_PREFIX_LOOKUP)
    [(kind, payload)] = bulk_records(port, head + bulk.LENGTH.pack(3) + b"\xff\xfe\xfd")
    assert kind == bulk.ERROR and bulk.parse_error(payload)[0] == "INVALID_ARGUMENT"
    [(kind, payload)] = bulk_records(port, lookup_request([b"k"], token="wrong"))
    assert kind == bulk.ERROR and bulk.parse_error(payload)[0] == "UNAUTHENTICATED"
    with VaultClient(v.address, token="s3cret") as c:
        c.put(b"ns", {b"k": b"v"})
        assert c.prefix_lookup(b"ns", [b"k"]) == 1, "the vault kept serving"
