"""Tenants on one real vault: tokens map to tenants and roles; the vault confines each tenant, quotas
evict only within the tenant, and only an admin flushes everything, crosses tenants or sees paths."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from tests.conftest import VaultFactory, token_file_args
from tests.vault.rawcalls import code_of, get, put, stats, unary
from tierkv.client.vault import VaultClient
from tierkv.vault.launcher import VaultProcess
from tierkv.wire import pb

TOKENS = """\
# token       tenant  role   quota
tok-admin     ops     admin
tok-a         alpha   user   1MiB
tok-b         beta    user
"""


@pytest.fixture
def tenant_vault(vault_factory: VaultFactory, tmp_path: Path) -> VaultProcess:
    return vault_factory(max_bytes="16MiB", extra_args=token_file_args(tmp_path, TOKENS))


def test_a_tenant_cannot_read_overwrite_delete_or_flush_another(tenant_vault: VaultProcess) -> None:
    with grpc.insecure_channel(tenant_vault.address) as ch:
        put(ch, b"shared-ns", {b"k": b"beta's bytes"}, token="tok-b")
        # same namespace and key from tenant alpha: a different entry, never beta's
        assert get(ch, b"shared-ns", [b"k"], token="tok-a") == [None]
        put(ch, b"shared-ns", {b"k": b"alpha's bytes"}, token="tok-a")
        assert get(ch, b"shared-ns", [b"k"], token="tok-b") == [b"beta's bytes"]
        assert get(ch, b"shared-ns", [b"k"], token="tok-a") == [b"alpha's bytes"]
        delete = pb.DeleteRequest(namespace=b"shared-ns", keys=[b"k"])
        assert (
            pb.DeleteReply.FromString(unary(ch, "Delete", delete.SerializeToString(), "tok-a")).deleted == 1
        )
        assert get(ch, b"shared-ns", [b"k"], token="tok-b") == [b"beta's bytes"]
        flush = pb.FlushRequest(namespace=b"shared-ns")
        unary(ch, "Flush", flush.SerializeToString(), "tok-a")
        assert get(ch, b"shared-ns", [b"k"], token="tok-b") == [b"beta's bytes"]
        lookup = pb.PrefixLookupRequest(namespace=b"shared-ns", keys=[b"k"]).SerializeToString()
        assert pb.PrefixLookupReply.FromString(unary(ch, "PrefixLookup", lookup, "tok-a")).count == 0
        # naming beta's tenant or asking for everything needs the admin role
        cross = pb.DeleteRequest(namespace=b"shared-ns", keys=[b"k"], tenant="beta").SerializeToString()
        assert code_of(unary, ch, "Delete", cross, "tok-a") is grpc.StatusCode.PERMISSION_DENIED
        everything = pb.FlushRequest(all_namespaces=True).SerializeToString()
        assert code_of(unary, ch, "Flush", everything, "tok-a") is grpc.StatusCode.PERMISSION_DENIED
        assert code_of(unary, ch, "Stats", b"", "nobody") is grpc.StatusCode.UNAUTHENTICATED
        assert get(ch, b"shared-ns", [b"k"], token="tok-b") == [b"beta's bytes"]
        # the admin may act in beta's namespaces
        assert pb.DeleteReply.FromString(unary(ch, "Delete", cross, "tok-admin")).deleted == 1
        assert get(ch, b"shared-ns", [b"k"], token="tok-b") == [None]


def test_stats_show_paths_and_every_tenant_to_an_admin_only(tenant_vault: VaultProcess) -> None:
    with grpc.insecure_channel(tenant_vault.address) as ch:
        put(ch, b"ns", {b"k": b"x" * 1000}, token="tok-a")
        user = stats(ch, "tok-a")
        assert (user.tenant, user.access, user.path, len(user.tenants)) == ("alpha", "user", "", 0)
        assert user.keys == 1 and user.max_bytes == 1 << 20
        assert stats(ch, "tok-b").keys == 0
        admin = stats(ch, "tok-admin")
        assert admin.access == "admin" and admin.path == str(tenant_vault.path)
        by_tenant = {t.tenant: t for t in admin.tenants}
        assert by_tenant["alpha"].keys == 1 and by_tenant["alpha"].quota_bytes == 1 << 20
        assert {"ops", "beta", "default"} <= set(by_tenant)


def test_quota_holds_under_tenfold_overfill_and_spares_other_tenants(tenant_vault: VaultProcess) -> None:
    blob = 64 * 1024
    with grpc.insecure_channel(tenant_vault.address) as ch:
        theirs = {f"b{i}".encode(): os.urandom(blob) for i in range(40)}
        put(ch, b"ns", theirs, token="tok-b")
        for i in range(0, 160, 8):  # 10 MiB into alpha's 1 MiB quota
            reply = put(
                ch, b"ns", {f"a{j}".encode(): os.urandom(blob) for j in range(i, i + 8)}, token="tok-a"
            )
            assert reply.stored == 8
            assert stats(ch, "tok-a").used_bytes <= 1 << 20
        assert stats(ch, "tok-a").evictions > 100
        assert get(ch, b"ns", list(theirs), token="tok-b") == list(theirs.values())
        assert stats(ch, "tok-b").evictions == 0


def test_a_single_bare_token_is_the_admin_of_the_default_tenant(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    v = vault_factory(extra_args=token_file_args(tmp_path, "just-one-token\n"))
    with grpc.insecure_channel(v.address) as ch:
        put(ch, b"ns", {b"k": b"v"}, token="just-one-token")
        s = stats(ch, "just-one-token")
        assert (s.tenant, s.access, s.keys) == ("default", "admin", 1)
        assert code_of(stats, ch, "wrong") is grpc.StatusCode.UNAUTHENTICATED


def test_a_bad_token_file_line_is_a_clear_start_up_error(vault_factory: VaultFactory, tmp_path: Path) -> None:
    v = vault_factory(extra_args=token_file_args(tmp_path, "tok-a alpha owner\n"), start=False)
    with pytest.raises(RuntimeError, match=r"tokens:1: the role must be admin or user"):
        v.start(timeout=20)
    assert "Traceback" not in v.log_tail(100)


@pytest.mark.parametrize("transport", ["grpc", "bulk"])
def test_a_full_vault_with_a_token_file_keeps_storing(
    vault_factory: VaultFactory, tmp_path: Path, transport: str
) -> None:
    """One `user` line makes two tenants (it and `default`): a Put that needs room must evict, not be
    refused (before the fix: 31 of 80 stored here, then nothing, evictions 0)."""
    v = vault_factory(max_bytes="4MiB", extra_args=token_file_args(tmp_path, "tok-u  solo  user\n"))
    blob = b"z" * (128 * 1024)
    stored = 0
    if transport == "grpc":
        with grpc.insecure_channel(v.address) as ch:
            for i in range(80):
                stored += put(ch, b"ns", {b"k%d" % i: blob}, token="tok-u").stored
            after = stats(ch, "tok-u")
    else:
        with VaultClient(v.address, token="tok-u", timeout=30) as c:
            for i in range(80):
                stored += c.put(b"ns", [(b"k%d" % i, blob)])
        with grpc.insecure_channel(v.address) as ch:
            after = stats(ch, "tok-u")
    assert stored == 80
    assert after.evictions > 0 and after.used_bytes <= 4 << 20


@pytest.mark.parametrize(
    ("lines", "starts"),
    [
        ("tok-a alpha user 1TiB\ntok-b beta user\n", False),  # one quota past the whole budget
        ("tok-a alpha user 12MiB\ntok-b beta user 12MiB\n", False),  # quotas that overcommit it
        ("tok-a alpha user 16MiB\ntok-b beta user\n", False),  # nothing left for beta
        ("tok-a alpha user 8MiB\ntok-b beta user 8MiB\n", True),  # the budget split exactly
    ],
)
def test_quotas_that_leave_a_tenant_no_room_are_refused_at_start(
    vault_factory: VaultFactory, tmp_path: Path, lines: str, starts: bool
) -> None:
    """A tenant with a quota is never evicted by another tenant's writes. With quotas past the budget
    the vault started, alpha filled it, and beta's every Put was refused from then on: the shared vault
    stopped storing for beta. Such a token file is now a start-up error naming vault.max_bytes."""
    from tests.test_cli import assert_clean_error, tierkv

    args = token_file_args(tmp_path, lines)
    cfg = Path(args[1])
    cfg.write_text(cfg.read_text() + f'[vault]\nmax_bytes = "16MiB"\npath = "{tmp_path / "v"}"\n')
    v = vault_factory(name="v", max_bytes="16MiB", extra_args=args, start=False)
    check = tierkv("config", "check", "--vault", "-c", str(cfg))
    if starts:
        v.start(timeout=20)
        assert check.returncode == 0, check.stdout + check.stderr
        return
    with pytest.raises(RuntimeError, match=r"vault\.max_bytes: .*quota"):
        v.start(timeout=20)
    assert "Traceback" not in v.log_tail(100)
    assert_clean_error(check, "quota")
