"""Emptying a vault takes an explicit, canonically encoded request from an admin; near-miss payloads
(a flipped bit, a wrong wire type, an empty namespace) flush nothing."""

from __future__ import annotations

import grpc
import pytest

from tests.conftest import VaultFactory
from tests.vault.rawcalls import code_of, get, put, stats, unary
from tierkv.wire import pb


@pytest.mark.parametrize(
    "payload",
    ["", "0801", "1005", "0a00", "1a03616263", "1001" + "2000", "0a026e731001", "1002"],
    ids=["empty", "08-01", "10-05", "0a-00", "1a-03-abc", "all+unknown", "ns+all", "10-02"],
)
def test_near_miss_flush_payloads_flush_nothing(vault_factory: VaultFactory, payload: str) -> None:
    v = vault_factory(name=f"f-{payload or 'empty'}")
    with grpc.insecure_channel(v.address) as ch:
        put(ch, b"ns", {b"a": b"1", b"b": b"2"})
        put(ch, b"other", {b"c": b"3"})
        code = code_of(unary, ch, "Flush", bytes.fromhex(payload))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert stats(ch).keys == 3
        assert get(ch, b"ns", [b"a", b"b"]) == [b"1", b"2"]


def test_explicit_flush_of_one_namespace_and_of_everything(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with grpc.insecure_channel(v.address) as ch:
        put(ch, b"ns", {b"a": b"1", b"b": b"2"})
        put(ch, b"other", {b"c": b"3"})
        one = pb.FlushRequest(namespace=b"ns").SerializeToString()
        assert pb.FlushReply.FromString(unary(ch, "Flush", one)).deleted == 2
        assert get(ch, b"other", [b"c"]) == [b"3"]
        everything = pb.FlushRequest(all_namespaces=True).SerializeToString()
        assert everything == bytes.fromhex("1001")
        assert pb.FlushReply.FromString(unary(ch, "Flush", everything)).deleted == 1
        assert stats(ch).keys == 0
