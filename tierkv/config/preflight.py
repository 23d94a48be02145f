"""What a start would trip over, checked before it starts: files, directories, addresses, ports.

These checks touch the machine (they read files, create the data directory, resolve hosts and bind probe
sockets), which is why they live apart from the schema: loading a config never does any of that.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from tierkv.certs import certificate_problem
from tierkv.config.schema import (
    Config,
)
from tierkv.endpoints import bind_problem
from tierkv.errors import ConfigError


def check_client_files(cfg: Config) -> None:
    """The token and TLS files the inference side reads exist and are readable (else a ConfigError)."""
    cfg.token()
    _check_readable(cfg, ("ca_file", "cert_file", "key_file"))


def check_vault_start(
    cfg: Config,
    *,
    ready_file: str | None = None,
    create: bool = True,
    before_disk: Callable[[], None] | None = None,
) -> None:
    """Everything ``tierkv vault`` would otherwise fail on with a traceback, checked before it starts.

    The TLS files, the ready file's directory, the bind address (resolvable and local), the metrics port
    (free), then ``before_disk`` (the vault's auth rules, which live above this layer), then the data
    directory (created here if missing and ``create``): a refused start makes nothing on disk. The token
    file is read by the vault's own parser (:func:`tierkv.vault.auth.load_tokens`); a taken gRPC port is
    left to the server, which reports it with its own exit code.
    """
    vc = cfg.vault
    if cfg.tls.enabled:
        if not (cfg.tls.cert_file and cfg.tls.key_file):
            raise ConfigError(cfg.source, "tls", "a vault needs both tls.cert_file and tls.key_file")
        _check_readable(cfg, ("cert_file", "key_file", "ca_file"))
    if ready_file:
        parent = Path(ready_file).expanduser().absolute().parent
        if not parent.is_dir():
            raise ConfigError("command line", "--ready-file", f"directory {parent} does not exist")
    _check_local_address(vc.host, cfg.source_of("vault.host"), "vault.host")
    if vc.metrics_port:
        key = "vault.metrics_host" if vc.metrics_host else "vault.host"
        _check_local_address(vc.metrics_host or vc.host, cfg.source_of(key), key)
        source = cfg.source_of("vault.metrics_port")
        _check_free_port(vc.metrics_host or vc.host, vc.metrics_port, source, "vault.metrics_port")
    if before_disk is not None:
        before_disk()
    _check_data_dir(vc.resolved_path(), cfg.source_of("vault.path"), create=create)


def _check_readable(cfg: Config, names: Iterable[str]) -> None:
    """Each named TLS file can be read, then each certificate among them is valid now (a missing file is
    the first thing to say: a certificate that cannot be parsed is often one whose key is missing too)."""
    paths = {name: Path(getattr(cfg.tls, name)).expanduser() for name in names if getattr(cfg.tls, name)}
    for name, path in paths.items():
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise ConfigError(
                cfg.source, f"tls.{name}", f"cannot read {path}: {exc.strerror or exc}"
            ) from exc
    for name, path in paths.items():
        problem = certificate_problem(path) if name in ("cert_file", "ca_file") else None
        if problem:
            raise ConfigError(cfg.source, f"tls.{name}", f"{path}: {problem}")
    if "cert_file" in paths and "key_file" in paths:
        _check_key_pair(cfg, paths["cert_file"], paths["key_file"])


def _check_key_pair(cfg: Config, cert: Path, key: Path) -> None:
    """The key is the certificate's: gRPC reports a key it cannot use only as a failed bind (a vault)
    or a failed handshake (a client), both pointing away from the file."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")  # an encrypted key fails, not prompts
    except (ssl.SSLError, OSError) as exc:
        problem = f"{key} is not an unencrypted private key of the certificate {cert} ({exc})"
        raise ConfigError(cfg.source, "tls.key_file", problem) from exc


def _check_data_dir(path: Path, source: str, *, create: bool) -> None:
    if path.exists() and not path.is_dir():  # else mkdir says "File exists", as if that were the problem
        raise ConfigError(source, "vault.path", f"{path} exists and is not a directory")
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)  # as the store makes it: 0700
        except OSError as exc:
            raise ConfigError(source, "vault.path", f"cannot create {path}: {exc.strerror or exc}") from exc
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(source, "vault.path", f"{existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            source, "vault.path", f"cannot create files in {existing}: not writable by this user"
        )


def _check_local_address(host: str, source: str, key: str) -> None:
    problem = _bind_problem(host, 0, source, key)
    if problem:
        raise ConfigError(source, key, f"cannot bind {host!r}: {problem} (not an address of this machine?)")


def _check_free_port(host: str, port: int, source: str, key: str) -> None:
    problem = _bind_problem(host, port, source, key)
    if problem:
        raise ConfigError(
            source, key, f"port {port} on {host} is taken ({problem}); pick another or 0 for none"
        )


def _bind_problem(host: str, port: int, source: str, key: str) -> str:
    """Why binding ``host:port`` fails right now ('' if it would not); a host that does not resolve is a
    ConfigError naming ``key``."""
    import socket

    try:
        return bind_problem(host, port)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(source, key, f"cannot resolve {host!r}: {exc}") from exc


__all__ = ["check_client_files", "check_vault_start"]
