"""Token ids with block metadata and the Hottest call, on real vaults over loopback: ids round-trip, are
bounded, go with their entry; Hottest orders chains by the hits of their last block, walks them root-first
and is confined to the caller's tenant."""

from __future__ import annotations

import itertools
from pathlib import Path

import grpc
import pytest

from tests.conftest import VaultFactory, token_file_args
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
    v = vault_factory(max_bytes="16MiB", extra_args=token_file_args(tmp_path, TOKENS))
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


def test_a_chain_longer_than_one_blocks_token_limit_is_answered_whole(vault: VaultProcess) -> None:
    """Warm start of a long prompt: 5 blocks of 4,096 ids (20,480 in the chain, past the 16,384 one block
    may carry) come back as one chain with every id."""
    per_block = MAX_BLOCK_TOKEN_BYTES // 4 // 4
    keys = [b"long%d" % i for i in range(5)]
    metas = [BlockMeta(tokens=tuple(range(i * per_block, (i + 1) * per_block))) for i in range(5)]
    with VaultClient(vault.address) as c:
        assert c.put(b"ns", {k: b"kv" for k in keys}, meta=keyed(metas, keys)) == 5
        (hot,) = c.hottest(b"ns")
        assert hot.keys == tuple(keys) and hot.tokens == tuple(range(5 * per_block))


def test_hottest_on_a_deep_chain_is_bounded_and_says_it_was_truncated(vault: VaultProcess) -> None:
    """A trunk of 3,000 blocks with 1,024 leaves: 1,024 chains of 3,001 keys of 60 bytes would be a
    190 MB reply (past any message limit). The vault answers the hottest that fit its bounds and says the
    reply was truncated."""
    trunk = [b"t%059d" % i for i in range(3000)]
    leaves = [b"l%059d" % i for i in range(1024)]
    metas = {trunk[0]: BlockMeta()}
    metas.update({k: BlockMeta(parent=p) for p, k in itertools.pairwise(trunk)})
    metas.update({k: BlockMeta(parent=trunk[-1]) for k in leaves})
    with VaultClient(vault.address, timeout=60) as c:
        assert c.put(b"deep", {k: b"v" for k in metas}, meta=metas) == len(metas)
    request = pb.HottestRequest(namespace=b"deep", limit=1024).SerializeToString()
    with grpc.insecure_channel(vault.address, options=[("grpc.max_receive_message_length", 64 << 20)]) as ch:
        reply = pb.HottestReply.FromString(unary(ch, "Hottest", request))
    assert reply.truncated and 0 < len(reply.chains) < 1024
    assert reply.ByteSize() <= 16 << 20
    for chain in reply.chains:
        assert list(chain.keys[:-1]) == trunk and chain.keys[-1] in leaves
    with VaultClient(vault.address, timeout=60) as c:  # the client takes the truncated reply as it is
        assert len(c.hottest(b"deep", limit=1024)) == len(reply.chains)
