"""Transport failures read as what they mean: against real processes, and for the C core's phrasings."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import VaultFactory
from tests.ports import refusing_port
from tierkv import VaultClient
from tierkv.client.plain import plain_details
from tierkv.errors import VaultUnavailable


@pytest.mark.parametrize(
    ("details", "says"),
    [
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:50051: "
            "Failed to connect to remote host: Connection refused",
            "connection refused: no vault listens there",
        ),
        (
            "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Socket closed",
            "needs [tls] on this side",
        ),
        ("Deadline Exceeded", "no answer within the deadline"),
        ("vault is shutting down", "vault is shutting down"),
    ],
)
def test_the_c_core_phrasings_are_said_plainly(details: str, says: str) -> None:
    plain = plain_details(details)
    assert says in plain and "ipv4:" not in plain


def test_nothing_listening_is_connection_refused() -> None:
    with (
        refusing_port() as nothing,
        VaultClient(f"127.0.0.1:{nothing}", timeout=5.0) as client,
        pytest.raises(VaultUnavailable) as info,
    ):
        client.stats()
    assert "connection refused: no vault listens there" in str(info.value)
    assert "failed to connect to all addresses" not in str(info.value)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_plaintext_client_of_a_tls_vault_is_told_about_tls(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    from tests.vault.test_tls import openssl

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "s.key", "-out", "s.crt", "-days", "2",
        "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", cwd=tmp_path,
    )  # fmt: skip
    cfg = tmp_path / "vault.toml"
    cfg.write_text(f'[tls]\ncert_file = "{tmp_path / "s.crt"}"\nkey_file = "{tmp_path / "s.key"}"\n')
    vault = vault_factory(extra_args=["--config", str(cfg)])
    with VaultClient(vault.address, timeout=5.0) as client, pytest.raises(VaultUnavailable) as info:
        client.stats()
    assert "[tls] on this side" in str(info.value), str(info.value)
