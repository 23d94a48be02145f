"""``tierkv admin`` and the RPCs under it, against real vault processes on loopback: listing namespaces,
inspecting one entry, flushing — each confined to the caller's tenant unless the token is an admin's."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import VaultFactory
from tests.test_cli import tierkv
from tests.vault.rawcalls import code_of, stats, unary
from tests.vault.test_tenancy import tenant_vault  # noqa: F401  (the fixture)
from tierkv import VaultClient
from tierkv.client import AsyncVaultClient
from tierkv.client.types import EntryStatus, blob_header
from tierkv.codec import MAX_HEADER_LEN, LayerGroup, encode
from tierkv.errors import AuthError, InvalidRequest
from tierkv.retention import BlockMeta
from tierkv.vault.launcher import VaultProcess
from tierkv.vault.store import HEAD_BYTES
from tierkv.wire import pb


def kv_blob(tokens: int = 16) -> bytes:
    values = np.random.default_rng(0).standard_normal((2, tokens, 4, 8)).astype(np.float32)
    return encode(values, codec="int8", tokens=tokens, layer_group=LayerGroup.ATTENTION)


def client(vault: VaultProcess, token: str | None = None) -> VaultClient:
    return VaultClient(vault.address, timeout=10, token=token)


def test_the_head_returned_holds_any_blob_header() -> None:
    assert HEAD_BYTES >= MAX_HEADER_LEN


def test_namespaces_list_keys_bytes_and_what_the_blocks_are(vault: VaultProcess) -> None:
    blob = kv_blob()
    with client(vault) as c:
        c.put(b"ns-a", {b"k1": blob, b"k2": blob}, meta={b"k1": BlockMeta(source="axioms", protected=True)})
        c.put(b"ns-b", {b"x": b"not a tierkv blob"})
        listed, truncated = c.list_namespaces()
        assert not truncated
        by_ns = {n.namespace: n for n in listed}
        assert set(by_ns) == {b"ns-a", b"ns-b"}
        a = by_ns[b"ns-a"]
        charge = len(b"ns-a") + 2 + len(blob)
        assert (a.tenant, a.keys, a.used_bytes, a.protected_bytes) == ("default", 2, 2 * charge, charge)
        header = blob_header(a.head)
        assert (header.codec, header.tokens, header.shape) == ("int8", 16, (2, 16, 4, 8))
        assert a.sample_key == b"k1"
        assert by_ns[b"ns-b"].used_bytes == len(b"ns-b") + 1 + len(b"not a tierkv blob")
        # the listing agrees with the vault's own accounting
        assert sum(n.used_bytes for n in listed) == c.stats().used_bytes
        one, truncated = c.list_namespaces(limit=1)
        assert truncated and [n.namespace for n in one] == [b"ns-a"]


def test_inspect_shows_class_and_hits_going_up_after_gets(vault: VaultProcess) -> None:
    blob = kv_blob()
    meta = {
        b"root": BlockMeta(source="axioms", importance=0.9, protected=True),
        b"child": BlockMeta(source="tools", importance=0.7, ttl_s=600, parent=b"root"),
    }
    with client(vault) as c:
        c.put(b"ns", {b"root": blob, b"child": blob, b"plain": b"y" * 10}, meta=meta)
        root = c.inspect(b"ns", b"root")
        assert root.found and root.has_meta
        assert (root.source, root.importance, root.protected, root.children) == ("axioms", 0.9, True, 1)
        assert root.hits == 0 and root.expiry == 0 and not root.expired
        assert root.size == len(blob) and root.charge == len(b"ns") + len(b"root") + len(blob)
        assert blob_header(root.head).tokens == 16
        child = c.inspect(b"ns", b"child")
        assert child.parent == b"root" and not child.protected
        assert 590 < child.expiry - time.time() <= 600
        # inspecting is not a read: no hit counted
        assert c.inspect(b"ns", b"root").hits == 0 and c.stats().hits == 0
        c.get(b"ns", [b"root"])
        assert c.inspect(b"ns", b"root").hits == 1  # not yet written to disk: still counted
        c.get(b"ns", [b"root", b"child"])
        c.put(b"other", {b"k": b"v"})  # the next write transaction writes the noted hits
        assert c.inspect(b"ns", b"root").hits == 2
        assert c.inspect(b"ns", b"child").hits == 1
        plain = c.inspect(b"ns", b"plain")
        assert plain.found and not plain.has_meta and plain.size == 10
        assert c.inspect(b"ns", b"absent").status is EntryStatus.MISSING


def test_a_user_lists_and_inspects_only_its_own_tenant(tenant_vault: VaultProcess) -> None:  # noqa: F811
    with client(tenant_vault, "tok-a") as alpha, client(tenant_vault, "tok-b") as beta:
        beta.put(b"beta-ns", {b"k": b"beta's"})
        alpha.put(b"alpha-ns", {b"k": b"alpha's"})
        listed, _ = alpha.list_namespaces()
        assert [(n.tenant, n.namespace) for n in listed] == [("alpha", b"alpha-ns")]
        with pytest.raises(AuthError, match="PERMISSION_DENIED"):
            alpha.list_namespaces(tenant="beta")
        with pytest.raises(AuthError, match="PERMISSION_DENIED"):
            alpha.inspect(b"beta-ns", b"k", tenant="beta")
        assert alpha.inspect(b"beta-ns", b"k").status is EntryStatus.MISSING  # its own tenant has none
        assert beta.inspect(b"beta-ns", b"k").tenant == "beta"
        s = alpha.stats()
        assert (s.tenant, s.access, s.tenants) == ("alpha", "user", ())
    with client(tenant_vault, "tok-admin") as admin:
        everything, _ = admin.list_namespaces()
        assert {(n.tenant, n.namespace) for n in everything} == {("alpha", b"alpha-ns"), ("beta", b"beta-ns")}
        only_beta, _ = admin.list_namespaces(tenant="beta")
        assert [n.tenant for n in only_beta] == ["beta"]
        assert admin.inspect(b"beta-ns", b"k", tenant="beta").found
        s = admin.stats()
        assert s.access == "admin" and {"alpha", "beta"} <= {t.tenant for t in s.tenants}
        # delete and flush can name a tenant (admin only)
        assert admin.delete(b"beta-ns", [b"k"], tenant="beta") == 1
        assert admin.flush(b"alpha-ns", tenant="alpha") == 1
    with client(tenant_vault, "tok-a") as alpha:
        with pytest.raises(AuthError, match="PERMISSION_DENIED"):
            alpha.flush(b"beta-ns", tenant="beta")
        assert alpha.list_namespaces() == ([], False)


def test_the_asyncio_client_lists_and_inspects(vault: VaultProcess) -> None:
    async def run() -> None:
        async with AsyncVaultClient(vault.address, timeout=10) as c:
            await c.put(b"ns", {b"k": b"v" * 5}, meta={b"k": BlockMeta(source="memories")})
            listed, truncated = await c.list_namespaces()
            assert [(n.namespace, n.keys) for n in listed] == [(b"ns", 1)] and not truncated
            entry = await c.inspect(b"ns", b"k")
            assert entry.found and entry.source == "memories" and entry.size == 5
            assert await c.flush(b"ns") == 1

    asyncio.run(run())


def test_garbage_to_the_new_rpcs_is_invalid_argument_and_the_vault_keeps_serving(vault: VaultProcess) -> None:
    bad = [
        ("ListNamespaces", b"\xff\xff\xff"),
        ("Inspect", b"\x0a\x10abc"),  # a namespace field longer than the message
        ("Inspect", pb.InspectRequest(namespace=b"ns", key=b"").SerializeToString()),
        ("Inspect", pb.InspectRequest(namespace=b"n" * 300, key=b"k").SerializeToString()),
        ("Inspect", pb.InspectRequest(namespace=b"ns", key=b"k" * 2000).SerializeToString()),
    ]
    with grpc.insecure_channel(vault.address) as ch:
        for method, request in bad:
            assert code_of(unary, ch, method, request) is grpc.StatusCode.INVALID_ARGUMENT, (method, request)
        assert stats(ch).version
    with client(vault) as c, pytest.raises(InvalidRequest):
        c.inspect(b"ns", b"")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["ListNamespaces", "Inspect"]), request=st.binary(max_size=64))
def test_fuzzed_requests_never_break_the_vault(vault: VaultProcess, method: str, request: bytes) -> None:
    with grpc.insecure_channel(vault.address) as ch:
        code = code_of(unary, ch, method, request)
        expected = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
        assert code in expected, (method, request, code)
        assert stats(ch).version


# -- the command line -------------------------------------------------------------------------------------


def admin_cli(vault: VaultProcess, *args: str, token: str = "", stdin: str = "") -> tuple[int, str, str]:
    env = {"TIERKV_TOKEN": token, "TIERKV_CONFIG": ""}
    result = tierkv("admin", *args, "--vault", vault.address, env=env, input=stdin)
    return result.returncode, result.stdout, result.stderr


def test_cli_lists_and_inspects_as_json_and_tables(vault: VaultProcess) -> None:
    blob = kv_blob()
    with client(vault) as c:
        c.put(b"ns", {b"k": blob}, meta={b"k": BlockMeta(source="rules", protected=True)})
        c.get(b"ns", [b"k"])
    code, stdout, stderr = admin_cli(vault, "namespaces", "--json")
    assert code == 0, stderr
    (listed,) = json.loads(stdout)["vaults"]
    (ns,) = listed["namespaces"]
    assert (ns["namespace"], ns["tenant"], ns["keys"], ns["model"]) == (b"ns".hex(), "default", 1, None)
    assert ns["blob"]["codec"] == "int8" and ns["blob"]["tokens"] == 16
    code, stdout, _ = admin_cli(vault, "namespaces")
    assert code == 0 and b"ns".hex() in stdout and "int8" in stdout and "digest" in stdout
    code, stdout, stderr = admin_cli(vault, "inspect", b"ns".hex(), b"k".hex(), "--json")
    assert code == 0, stderr
    (entry,) = json.loads(stdout)["vaults"]
    assert entry["status"] == "found" and entry["blob"]["layer_group"] == "attention"
    assert entry["retention"]["class"] == "rules" and entry["retention"]["protected"]
    assert entry["retention"]["hits"] == 1
    code, stdout, _ = admin_cli(vault, "inspect", b"ns".hex(), b"k".hex())
    assert code == 0 and "class: rules" in stdout and "hits (decayed): 1" in stdout
    code, _, stderr = admin_cli(vault, "inspect", "not-hex", "00")
    assert code == 2 and "expected hex" in stderr and "Traceback" not in stderr


def test_cli_flush_asks_first_and_flush_all_needs_an_admin(
    tenant_vault: VaultProcess,  # noqa: F811
) -> None:
    with client(tenant_vault, "tok-a") as alpha, client(tenant_vault, "tok-b") as beta:
        alpha.put(b"ns", {b"k": b"alpha's"})
        beta.put(b"ns", {b"k": b"beta's"})
    ns = b"ns".hex()
    # declined (or no answer at all): nothing is flushed
    for answer in ("n\n", ""):
        code, _, _ = admin_cli(tenant_vault, "flush", ns, token="tok-a", stdin=answer)
        assert code == 1
    with client(tenant_vault, "tok-a") as alpha:
        assert alpha.get(b"ns", [b"k"]) == [b"alpha's"]
    code, stdout, _ = admin_cli(tenant_vault, "flush", ns, token="tok-a", stdin="y\n")
    assert code == 0 and "deleted 1 entries" in stdout
    # a user's --all is refused before anyone is asked; beta's entry survives
    code, _, stderr = admin_cli(tenant_vault, "flush", "--all", "--yes", token="tok-a")
    assert code == 1 and "admin" in stderr and "Traceback" not in stderr
    code, _, _ = admin_cli(tenant_vault, "flush", "--all", token="tok-admin", stdin="n\n")
    assert code == 1
    with client(tenant_vault, "tok-b") as beta:
        assert beta.get(b"ns", [b"k"]) == [b"beta's"]
    code, stdout, stderr = admin_cli(tenant_vault, "flush", "--all", "--yes", token="tok-admin")
    assert code == 0 and "deleted 1 entries" in stdout, stderr
    with client(tenant_vault, "tok-b") as beta:
        assert beta.get(b"ns", [b"k"]) == [None]
    code, _, stderr = admin_cli(tenant_vault, "flush", ns, "--all", "--yes", token="tok-admin")
    assert code == 2 and "not both" in stderr


def test_cli_user_cannot_list_another_tenant(tenant_vault: VaultProcess) -> None:  # noqa: F811
    with client(tenant_vault, "tok-b") as beta:
        beta.put(b"beta-ns", {b"k": b"x"})
    code, stdout, _ = admin_cli(tenant_vault, "namespaces", "--json", token="tok-a")
    assert code == 0 and json.loads(stdout)["vaults"][0]["namespaces"] == []
    code, _, stderr = admin_cli(tenant_vault, "namespaces", "--tenant", "beta", token="tok-a")
    assert code == 1 and "PERMISSION_DENIED" in stderr
    code, stdout, _ = admin_cli(tenant_vault, "namespaces", "--json", token="tok-admin")
    tenants = {n["tenant"] for n in json.loads(stdout)["vaults"][0]["namespaces"]}
    assert code == 0 and tenants == {"beta"}


def test_cli_backup_is_reachable_under_admin(vault_factory: VaultFactory, tmp_path: Path) -> None:
    vault = vault_factory()
    with client(vault) as c:
        c.put(b"ns", {b"k": b"kept"})
    result = tierkv("admin", "backup", str(vault.path), str(tmp_path / "copy"))
    assert result.returncode == 0, result.stderr
    with client(vault_factory(name="copy")) as c:  # a vault on the copy (the factory's path tmp/copy)
        assert c.get(b"ns", [b"k"]) == [b"kept"]


def test_cli_refused_everywhere_prints_no_empty_table(tenant_vault: VaultProcess) -> None:  # noqa: F811
    code, stdout, stderr = admin_cli(tenant_vault, "namespaces", token="wrong-token")
    assert code == 1 and "UNAUTHENTICATED" in stderr
    assert stdout == "", stdout
