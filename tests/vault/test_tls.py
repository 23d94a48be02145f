"""TLS and mutual TLS between a real vault process and the client (certificates made by the test)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import VaultFactory
from tierkv import VaultClient
from tierkv.config import TLSConfig
from tierkv.errors import VaultUnavailable

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def key_and_request(d: Path, name: str) -> None:
    """``name.key`` (RSA, unencrypted) and a signing request ``name.csr`` for ``CN=name``, in ``d``."""
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
        key_and_request(d, name)
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


def expired_certificate(d: Path) -> Path:
    """A self-signed certificate valid only on 1 January 2020 (``openssl ca`` sets both dates)."""
    d.mkdir(exist_ok=True)
    (d / "ca.cnf").write_text(
        "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nserial = serial\nnew_certs_dir = .\n"
        "default_md = sha256\npolicy = p\n[p]\ncommonName = supplied\n"
    )
    (d / "index.txt").write_text("")
    (d / "serial").write_text("01\n")
    key_and_request(d, "old")
    openssl(
        "ca", "-config", "ca.cnf", "-selfsign", "-keyfile", "old.key", "-in", "old.csr", "-batch",
        "-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-out", "old.crt", cwd=d,
    )  # fmt: skip
    return d / "old.crt"


def test_certificate_dates_are_read_against_an_injected_clock(pki: Path) -> None:
    from tierkv.certs import certificate_problem

    assert certificate_problem(pki / "server.crt") is None
    assert "expired on" in (certificate_problem(pki / "server.crt", now=time.time() + 10 * 86400) or "")
    assert "not valid before" in (certificate_problem(pki / "server.crt", now=0.0) or "")
    assert "not a readable PEM certificate" in (certificate_problem(pki / "server.key") or "")


def test_an_expired_certificate_is_refused_by_config_check_and_at_start(tmp_path: Path) -> None:
    from tests.test_cli import assert_clean_error, tierkv

    cert = expired_certificate(tmp_path / "old")
    cfg = tmp_path / "vault.toml"
    cfg.write_text(f'[tls]\ncert_file = "{cert}"\nkey_file = "{cert.with_suffix(".key")}"\n')
    assert_clean_error(tierkv("config", "check", "-c", str(cfg)), "tls.cert_file", "expired on")
    assert_clean_error(
        tierkv("vault", "-c", str(cfg), "--port", "0", "--path", str(tmp_path / "v")),
        "tls.cert_file",
        "expired",
    )


def test_a_key_without_its_certificate_is_refused_not_served_in_plaintext(tmp_path: Path, pki: Path) -> None:
    """``cert_file`` left empty (a template variable that rendered to nothing) with the key still set: the
    vault started in plaintext, bulk port included, and a client with the same section spoke plaintext."""
    from tests.test_cli import assert_clean_error, tierkv

    cfg = tmp_path / "vault.toml"
    cfg.write_text(f'[tls]\ncert_file = ""\nkey_file = "{pki / "server.key"}"\n')
    needle = "tls.cert_file and tls.key_file"
    assert_clean_error(tierkv("config", "check", "-c", str(cfg)), needle)
    assert_clean_error(tierkv("vault", "-c", str(cfg), "--port", "0", "--path", str(tmp_path / "v")), needle)


def test_a_key_that_is_not_the_certificates_is_a_config_error_naming_it(tmp_path: Path, pki: Path) -> None:
    """The client's key with the server's certificate (or a file that is no key) failed inside gRPC's bind,
    reported as a taken port (exit status 3, "is another vault running there?")."""
    from tests.test_cli import assert_clean_error, tierkv

    (tmp_path / "empty.key").write_text("")
    for key in (pki / "client.key", pki / "server.crt", tmp_path / "empty.key"):
        cfg = tmp_path / "vault.toml"
        cfg.write_text(f'[tls]\ncert_file = "{pki / "server.crt"}"\nkey_file = "{key}"\n')
        for args in (("config", "check", "-c", str(cfg)), ("vault", "-c", str(cfg), "--port", "0")):
            result = tierkv(*args, "--path", str(tmp_path / "v")) if args[0] == "vault" else tierkv(*args)
            assert_clean_error(result, "tls.key_file", str(key))


def test_a_tls_client_of_a_plaintext_vault_gets_nothing(vault_factory: VaultFactory, pki: Path) -> None:
    v = vault_factory()
    with VaultClient(v.address, tls=TLSConfig(ca_file=str(pki / "ca.crt")), timeout=1.0) as c:
        with pytest.raises(VaultUnavailable):
            c.put(b"ns", {b"k": b"v"})
    with VaultClient(v.address) as plain:
        assert plain.get(b"ns", [b"k"]) == [None], "nothing arrived in plaintext"


def test_with_tls_the_vault_opens_no_plaintext_bulk_port(
    vault_factory: VaultFactory, pki: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "vault.toml"
    cfg.write_text(f'[tls]\ncert_file = "{pki / "server.crt"}"\nkey_file = "{pki / "server.key"}"\n')
    v = vault_factory(extra_args=["--config", str(cfg)])
    with VaultClient(v.address, tls=TLSConfig(ca_file=str(pki / "ca.crt"))) as c:
        assert c.stats().bulk_port == 0
        assert c.put(b"ns", {b"k": b"v" * 1000}) == 1 and c.get(b"ns", [b"k"]) == [b"v" * 1000]
    assert "bulk off" in v.log_tail()
