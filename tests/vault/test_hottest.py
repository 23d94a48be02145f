"""Token ids with block metadata and the Hottest call, on real vaults over loopback: ids round-trip, are
bounded, go with their entry; Hottest orders chains by the hits of their last block, walks them root-first
and is confined to the caller's tenant."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.conftest import VaultFactory
from tests.vault.rawcalls import Ident, code_of, unary
from tests.vault.test_tenancy import TOKENS
from tierkv.client import VaultClient
from tierkv.client.cluster import Cluster
from tierkv.errors import VaultError
from tierkv.limits import MAX_BLOCK_TOKEN_BYTES
from tierkv.retention import BlockMeta, keyed
from tierkv.vault.hottest import chain_ends, walk
from tierkv.vault.launcher import VaultProcess
from tierkv.vault.store import ChainEntry
from tierkv.wire import SERVICE, pb
from tierkv.wire.framing import build_frame

BS = 4


def chain(prefix: bytes, n: int, first_token: int = 0) -> tuple[dict[bytes, bytes], dict[bytes, BlockMeta]]:
    """``n`` blocks of ``BS`` tokens: blobs and metadata with parents and token ids."""
    keys = [prefix + b"%d" % i for i in range(n)]
    tokens = list(range(first_token, first_token + n * BS))
    metas = [BlockMeta(tokens=tuple(tokens[i * BS : (i + 1) * BS])) for i in range(n)]
    return {k: b"kv" + k for k in keys}, keyed(metas, keys)


def test_token_ids_round_trip_and_leave_with_their_entry(vault: VaultProcess) -> None:
    blobs, meta = chain(b"a", 3)
    with VaultClient(vault.address) as c:
        assert c.put(b"ns", blobs, meta=meta) == 3
        (hot,) = c.hottest(b"ns")
        assert hot.keys == (b"a0", b"a1", b"a2") and hot.tokens == tuple(range(12))
        used = c.stats().used_bytes
        assert used == sum(len(b"ns") + len(k) + len(v) + 4 * BS for k, v in blobs.items())
        c.put(b"ns", {b"a2": b"again"}, meta={b"a2": BlockMeta(parent=b"a1")})  # no ids now
        (hot,) = c.hottest(b"ns")
        assert hot.keys == (b"a0", b"a1", b"a2") and hot.tokens == ()
        c.delete(b"ns", [b"a0"])
        assert all(h.tokens == () for h in c.hottest(b"ns"))  # the root is gone: nothing to replay
        c.put(b"ns", {b"a0": b"x"}, meta={b"a0": BlockMeta()})
        assert all(h.tokens == () for h in c.hottest(b"ns"))  # put back without ids: still none


def test_too_many_token_ids_are_invalid_argument(vault: VaultProcess) -> None:
    with pytest.raises(ValueError):
        BlockMeta(tokens=(1,) * (MAX_BLOCK_TOKEN_BYTES // 4 + 1))
    for tokens in (b"\0" * (MAX_BLOCK_TOKEN_BYTES + 4), b"\0\0\0"):
        header = pb.FrameHeader(namespace=b"ns")
        header.segments.add(key=b"k", status=pb.FOUND, size=1, length=1, meta=pb.BlockMeta(tokens=tokens))
        with grpc.insecure_channel(vault.address) as ch:
            call = ch.stream_unary(f"/{SERVICE}/Put", Ident, Ident)
            with pytest.raises(grpc.RpcError) as err:
                call(iter([build_frame(header, [b"z"])]), timeout=10)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with VaultClient(vault.address) as c:
        assert c.put(b"ns", {b"k": b"v"}, meta={b"k": BlockMeta(tokens=(1,) * 16384)}) == 1
        assert c.hottest(b"ns")[0].tokens == (1,) * 16384


def test_hottest_orders_by_the_last_blocks_hits_and_walks_chains(vault: VaultProcess) -> None:
    system, system_meta = chain(b"s", 2)  # a shared prefix
    with VaultClient(vault.address) as c:
        c.put(b"ns", system, meta=system_meta)
        for name, hits in ((b"x", 1), (b"y", 3)):  # two conversations on top of it
            blobs, meta = chain(name, 2, first_token=100)
            first = next(iter(meta))
            meta[first] = BlockMeta(parent=b"s1", tokens=meta[first].tokens)
            c.put(b"ns", blobs, meta=meta)
            for _ in range(hits):
                assert None not in c.get(b"ns", [b"s0", b"s1", *blobs])
        z, z_meta = chain(b"z", 1, first_token=500)
        c.put(b"ns", z, meta=z_meta)  # stored, never read
        got = c.hottest(b"ns")
        assert [h.keys for h in got] == [(b"s0", b"s1", b"y0", b"y1"), (b"s0", b"s1", b"x0", b"x1"), (b"z0",)]
        assert got[0].hits > got[1].hits > got[2].hits == 0
        assert got[0].tokens == got[1].tokens == (*range(8), *range(100, 108))
        assert [h.keys for h in c.hottest(b"ns", limit=1)] == [got[0].keys]
        assert c.hottest(b"other") == []


def test_chain_ends_prefer_the_longest_reused_prefix() -> None:
    """A hot prefix continued only by chains never hit again ends at itself; a hit child ends further."""
    entries = [
        ChainEntry(b"r", b"", 10.0, 1, "axioms"),
        ChainEntry(b"a", b"r", 0.0, 2, ""),
        ChainEntry(b"b", b"r", 0.0, 3, ""),
    ]
    assert [e.key for e in chain_ends(entries)] == [b"r", b"b", b"a"]
    entries[1] = ChainEntry(b"a", b"r", 4.0, 2, "")
    assert [e.key for e in chain_ends(entries)] == [b"a", b"b"]
    loop = {b"p": ChainEntry(b"p", b"q", 1.0, 1, ""), b"q": ChainEntry(b"q", b"p", 1.0, 1, "")}
    assert walk(loop[b"p"], loop) == ([loop[b"q"], loop[b"p"]], False)


def test_hottest_is_confined_to_the_callers_tenant(vault_factory: VaultFactory, tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(TOKENS)
    cfg = tmp_path / "tenants.toml"
    cfg.write_text(f'[auth]\ntoken_file = "{token_file}"\n')
    v = vault_factory(max_bytes="16MiB", extra_args=["--config", str(cfg)])
    with VaultClient(v.address, token="tok-a") as alpha, VaultClient(v.address, token="tok-b") as beta:
        blobs, meta = chain(b"a", 2)
        alpha.put(b"ns", blobs, meta=meta)
        assert beta.hottest(b"ns") == []
        with pytest.raises(VaultError) as err:
            beta.hottest(b"ns", tenant="alpha")
        assert err.value.code == "PERMISSION_DENIED"
    with Cluster({"kv_cold": v.address}, token="tok-admin") as admin:
        assert [h.keys for h in admin.hottest(b"ns", tenant="alpha")] == [(b"a0", b"a1")]


def test_garbage_hottest_requests_are_invalid_argument_and_the_vault_keeps_serving(
    vault: VaultProcess,
) -> None:
    with grpc.insecure_channel(vault.address) as ch:
        assert code_of(unary, ch, "Hottest", b"\xff\xff\xff") is grpc.StatusCode.INVALID_ARGUMENT
        too_long = pb.HottestRequest(namespace=b"n" * 256).SerializeToString()
        assert code_of(unary, ch, "Hottest", too_long) is grpc.StatusCode.INVALID_ARGUMENT
        huge = pb.HottestRequest(namespace=b"ns", limit=2**32 - 1).SerializeToString()
        assert pb.HottestReply.FromString(unary(ch, "Hottest", huge)).chains == []
    with VaultClient(vault.address) as c:
        assert c.health()
