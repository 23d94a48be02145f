"""TLS and mutual TLS between a real vault process and the client (certificates made by the test)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import VaultFactory
from tierkv import VaultClient
from tierkv.config import TLSConfig
from tierkv.errors import VaultUnavailable

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    d = tmp_path / "pki"
    d.mkdir()
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=tierkv test CA",
        cwd=d,
    )
    for name in ("server", "client"):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=d,
        )
        (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=d,
        )
    return d


def test_mutual_tls(vault_factory: VaultFactory, pki: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "vault.toml"
    cfg.write_text(
        f'[tls]\ncert_file = "{pki / "server.crt"}"\nkey_file = "{pki / "server.key"}"\n'
        f'ca_file = "{pki / "ca.crt"}"\n'
    )
    v = vault_factory(extra_args=["--config", str(cfg)])
    client_tls = TLSConfig(
        cert_file=str(pki / "client.crt"), key_file=str(pki / "client.key"), ca_file=str(pki / "ca.crt")
    )
    with VaultClient(v.address, tls=client_tls) as c:
        assert c.put(b"ns", {b"k": b"secret"}) == 1
        assert c.get(b"ns", [b"k"]) == [b"secret"]
    without_cert = TLSConfig(ca_file=str(pki / "ca.crt"))
    with VaultClient(v.address, tls=without_cert, timeout=1.0) as c, pytest.raises(VaultUnavailable):
        c.stats()
    with VaultClient(v.address, timeout=1.0) as plaintext, pytest.raises(VaultUnavailable):
        plaintext.stats()
