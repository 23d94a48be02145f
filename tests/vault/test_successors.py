"""Successors: the vault's prefetch hints, learned from stored parent keys and from co-access.

The daemon tests use real vault processes on loopback; the bounds are a hypothesis property of the
learner itself (the same object the daemon runs), driven with a fake clock so the window is exact."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import VaultFactory, token_file_args
from tests.vault.rawcalls import code_of, unary
from tierkv.client import VaultClient
from tierkv.retention import BlockMeta
from tierkv.vault.successors import (
    DEFAULT_MAX_ENTRIES,
    MAX_CHILDREN,
    NODE_BYTES,
    SuccessorLearner,
    TenantLearners,
)
from tierkv.wire import pb

NS = b"ns-successors"
BLOB = b"x" * 100


def k(name: str) -> bytes:
    return name.encode().ljust(8, b".")


def store_chain(c: VaultClient, names: list[str], parent: str = "") -> None:
    """Put a chain, each block naming the one before it (the first names ``parent``)."""
    parents = [parent, *names[:-1]]
    c.put(
        NS,
        {k(n): BLOB for n in names},
        meta={k(n): BlockMeta(parent=k(p) if p else b"") for n, p in zip(names, parents, strict=True)},
    )


def keys_of(found: list) -> list[str]:  # type: ignore[type-arg]
    return [s.key.decode().rstrip(".") for s in found]


def test_continuations_follow_the_most_hit_child(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with VaultClient(v.address, timeout=10) as c:
        store_chain(c, ["root", "sys"])
        store_chain(c, ["a1", "a2"], parent="sys")  # two continuations of the same prefix
        store_chain(c, ["b1", "b2"], parent="sys")
        for _ in range(3):
            c.get(NS, [k("root"), k("sys"), k("b1"), k("b2")])
        c.get(NS, [k("root"), k("sys"), k("a1")])
        found = c.successors(NS, [k("root"), k("sys")])
        assert keys_of(found) == ["b1", "b2"]  # the most-hit path, walked down; a1 lost
        assert found[0].size == len(BLOB) and found[0].score >= found[1].score > 0  # b2 is b1's only child
        # bounds: one key, or too few bytes for even one
        assert keys_of(c.successors(NS, [k("root"), k("sys")], max_keys=1)) == ["b1"]
        assert c.successors(NS, [k("root"), k("sys")], max_bytes=len(BLOB) - 1) == []
        # deleted keys are forgotten: the walk now takes the other child
        assert c.delete(NS, [k("b1")]) == 1
        assert keys_of(c.successors(NS, [k("root"), k("sys")])) == ["a1", "a2"]


def test_co_accessed_chains_are_suggested_by_how_often(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    with VaultClient(v.address, timeout=10) as c:
        for name in ("rules", "tools", "memo"):
            store_chain(c, [name + "1", name + "2"])
        rules = [k("rules1"), k("rules2")]
        for _ in range(2):
            c.get(NS, rules)
            c.get(NS, [k("tools1"), k("tools2")])
        c.get(NS, rules)
        c.get(NS, [k("memo1"), k("memo2")])
        found = c.successors(NS, rules)
        assert keys_of(found) == ["tools1", "tools2", "memo1", "memo2"]
        assert found[0].score > found[2].score
        # a fetch of exactly what was suggested is a prefetch: it teaches nothing
        c.get(NS, [k("memo1"), k("memo2")])
        c.get(NS, [k("memo1"), k("memo2")])
        assert keys_of(c.successors(NS, rules))[:2] == ["tools1", "tools2"]
        # a longer chain through the end of `rules` (the next turn of a conversation) is linked the same
        store_chain(c, ["rules3"], parent="rules2")
        assert keys_of(c.successors(NS, [*rules, k("rules3")]))[:2] == ["tools1", "tools2"]


def test_a_tenant_sees_only_its_own_successors(vault_factory: VaultFactory, tmp_path: Path) -> None:
    v = vault_factory(extra_args=token_file_args(tmp_path, "tok-a alpha user\ntok-b beta user\n"))
    with (
        VaultClient(v.address, timeout=10, token="tok-a") as a,
        VaultClient(v.address, timeout=10, token="tok-b") as b,
    ):
        store_chain(a, ["r", "s"])
        a.get(NS, [k("r"), k("s")])
        assert keys_of(a.successors(NS, [k("r")])) == ["s"]
        assert b.successors(NS, [k("r")]) == []


def test_garbage_successors_requests_are_invalid_and_the_vault_keeps_serving(
    vault_factory: VaultFactory,
) -> None:
    v = vault_factory()
    bad = [
        b"\xff\xfe\xfd",
        pb.SuccessorsRequest(namespace=NS).SerializeToString(),  # no keys
        pb.SuccessorsRequest(namespace=NS, keys=[b""]).SerializeToString(),
        pb.SuccessorsRequest(namespace=b"n" * 1000, keys=[b"k"]).SerializeToString(),
    ]
    with grpc.insecure_channel(v.address) as ch:
        for payload in bad:
            assert code_of(unary, ch, "Successors", payload) is grpc.StatusCode.INVALID_ARGUMENT, payload
        ok = pb.SuccessorsReply.FromString(
            unary(ch, "Successors", pb.SuccessorsRequest(namespace=NS, keys=[b"k"]).SerializeToString())
        )
        assert list(ok.successors) == []
    assert v.stop() == 0
    assert "Traceback" not in v.log_file.read_text()


# -- the learner's bounds (a property) ---------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


events = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "drop", "ask", "tick"]),
        st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=6),
        st.sampled_from(["t1", "t2"]),
    ),
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(
    ops=events,
    max_entries=st.integers(min_value=1, max_value=20),
    max_keys=st.integers(min_value=1, max_value=8),
)
def test_the_learner_stays_within_its_bounds_and_suggests_only_stored_keys(
    ops: list[tuple[str, list[int], str]], max_entries: int, max_keys: int
) -> None:
    clock = Clock()
    learner = SuccessorLearner(
        window_s=5.0, max_entries=max_entries, max_bytes=max_entries * 600, clock=clock, wall=clock
    )
    stored: dict[tuple[str, bytes], int] = {}
    for op, ids, tenant in ops:
        keys = [b"key%d" % i for i in ids]
        if op == "put":
            learner.stored(
                tenant,
                NS,
                [
                    (key, 10 + i, BlockMeta(parent=b"key%d" % (i - 1) if i else b""))
                    for key, i in zip(keys, ids, strict=True)
                ],
            )
            stored.update({(tenant, key): 10 + i for key, i in zip(keys, ids, strict=True)})
        elif op == "get":
            learner.fetched(tenant, NS, keys)
        elif op == "drop":
            learner.forget((tenant, NS, key) for key in keys)
            for key in keys:
                stored.pop((tenant, key), None)
        elif op == "tick":
            clock.now += ids[0]
        else:
            found = learner.successors(tenant, NS, keys, max_keys=max_keys, max_bytes=40 * max_keys)
            assert len(found) <= max_keys and sum(s.size for s in found) <= 40 * max_keys
            assert len({s.key for s in found}) == len(found) and not {s.key for s in found} & set(keys)
            for s in found:
                assert stored.get((tenant, s.key)) == s.size  # only what this tenant still stores
            assert [s.score for s in found] == sorted((s.score for s in found), reverse=True)
        assert learner.entries <= max_entries
        assert 0 <= learner.used_bytes <= max_entries * 600
        recount = sum(node.cost(nid[2]) for nid, node in learner._nodes.items())
        assert learner.used_bytes == recount  # the running figure is exact, not only bounded


def test_the_learner_refuses_bounds_it_cannot_keep() -> None:
    with pytest.raises(ValueError):
        SuccessorLearner(max_bytes=NODE_BYTES - 1)


def test_the_co_access_window_is_the_vaults_setting(vault_factory: VaultFactory, tmp_path: Path) -> None:
    cfg = tmp_path / "window.toml"
    cfg.write_text("[vault]\ncoaccess_window_s = 0\n")
    v = vault_factory(extra_args=["--config", str(cfg)])
    with VaultClient(v.address, timeout=10) as c:
        store_chain(c, ["w1"])
        store_chain(c, ["w2"])
        for _ in range(3):
            c.get(NS, [k("w1")])
            c.get(NS, [k("w2")])
        assert c.successors(NS, [k("w1")]) == []  # nothing is fetched within 0 s of anything else


# -- per tenant, bounded per call ----------------------------------------------------------------------


def test_one_tenants_learner_never_holds_up_anothers() -> None:
    """Each tenant learns under a lock of its own: while alpha's learner is busy (its lock held here, as a
    long answer would hold it), beta's stores and answers go on."""
    learners = TenantLearners(["alpha", "beta"])
    done = threading.Event()

    def beta() -> None:
        learners.stored("beta", NS, [(k("b0"), 10, None), (k("b1"), 10, BlockMeta(parent=k("b0")))])
        learners.fetched("beta", NS, [k("b0"), k("b1")])
        assert keys_of(learners.successors("beta", NS, [k("b0")])) == ["b1"]
        done.set()

    with learners.of("alpha")._lock:
        t = threading.Thread(target=beta)
        t.start()
        t.join(10)
        assert done.is_set(), "beta waited for alpha's learner"
    assert learners.of("alpha").entries == 0 and learners.of("beta").entries == 2


def test_a_block_with_50000_children_keeps_its_calls_bounded() -> None:
    """A parent stored with 50,000 children is linked to at most MAX_CHILDREN of them, so a Successors
    call looks at a bounded number of children; the hottest tracked child is still suggested."""
    learners = TenantLearners(["alpha"])
    kids = [(b"c%06d" % i, 10, BlockMeta(parent=k("p"))) for i in range(50_000)]
    learners.stored("alpha", NS, [(k("p"), 10, None), *kids])
    parent = learners.of("alpha")._nodes[("alpha", NS, k("p"))]
    assert len(parent.children) == MAX_CHILDREN
    learners.fetched("alpha", NS, [k("p"), b"c000007"])
    (best,) = learners.successors("alpha", NS, [k("p")], max_keys=1)
    assert best.key == b"c000007"
    assert learners.entries <= DEFAULT_MAX_ENTRIES


def test_learners_share_the_bounds_between_tenants() -> None:
    learners = TenantLearners(["a", "b", "c", "d"], max_entries=400, max_bytes=1 << 20)
    for t in ("a", "b", "c", "d"):
        learners.stored(t, NS, [(b"%s%d" % (t.encode(), i), 1, None) for i in range(1000)])
    assert learners.entries == 400 and all(learners.of(t).entries == 100 for t in "abcd")
    learners.forget_tenant("a")
    assert learners.of("a").entries == 0 and learners.entries == 300
    learners.forget([("b", NS, b"b999"), ("nobody", NS, b"x")])
    assert learners.of("b").entries == 99


def test_a_tenants_50000_children_parent_leaves_another_tenants_puts_working(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    """On a real vault: alpha stores a parent with 50,000 children and asks for its successors; beta's
    Puts and Successors answer as usual, and alpha's answer is bounded."""
    (tmp_path / "tokens").write_text("tok-admin ops admin\ntok-a alpha user\ntok-b beta user\n")
    cfg = tmp_path / "vault.toml"
    cfg.write_text(f'[auth]\ntoken_file = "{tmp_path / "tokens"}"\n')
    v = vault_factory(extra_args=["--config", str(cfg)])
    kids = {b"c%06d" % i: b"x" for i in range(50_000)}
    with VaultClient(v.address, token="tok-a", timeout=120) as alpha:
        store_chain(alpha, ["p"])
        assert alpha.put(NS, kids, meta={key: BlockMeta(parent=k("p")) for key in kids}) == 50_000
        assert alpha.get(NS, [k("p"), b"c000042"]) == [BLOB, b"x"]
        assert len(alpha.successors(NS, [k("p")], max_keys=4096)) >= 1
    with VaultClient(v.address, token="tok-b") as beta:
        for i in range(5):
            store_chain(beta, [f"b{i}a", f"b{i}b"])
            assert beta.get(NS, [k(f"b{i}a")]) == [BLOB]
        assert keys_of(beta.successors(NS, [k("b0a")]))[0] == "b0b"  # then the chains fetched after it
