"""Who is calling: tokens map to a tenant and an access role, checked in constant time on every call.

The vault reads ``auth.token_file`` (or ``$TIERKV_TOKEN``). The file takes one of two forms, never both:

- exactly one bare token, alone in the file: an admin of the ``default`` tenant;
- lines ``<token> <tenant> <admin|user> [quota]``, e.g. ``s3cr3t-a acme user 2GiB``. ``quota`` caps the
  tenant's stored bytes (the same on every line of a tenant, or given once).

Blank lines and lines starting with ``#`` are skipped. The file is read by one parser
(:func:`read_token_file`), at start and by ``tierkv config check --vault``, and it fails closed: a
configured file that names no token, a bare token among tenant lines (a wrapped line), or any other line
it cannot read exactly is refused as ``file:line: problem``, and the vault does not start. Without a
token file and without ``$TIERKV_TOKEN`` the vault is open: every caller is an admin of the default
tenant, and the vault says so at start. An open vault listens on loopback only, unless ``[auth]
allow_open`` says its network is trusted (:func:`check_open`): a missing token file must not put every
tenant's KV on the network. Health checks never need a token.

On gRPC a token travels as ``authorization: Bearer <token>`` and a header without the ``Bearer`` scheme is
no token; on the bulk port it travels bare in the request head. Both carry at most
:data:`~tierkv.limits.MAX_AUTH_TOKEN_BYTES` of printable ASCII, and a token file naming a longer one is
refused when it is read, so a token never works on one transport and fails on the other.

A ``user`` works only in its own tenant's namespaces; an ``admin`` may also flush everything, act in
another tenant's namespaces (Delete / Flush naming a tenant) and sees the store path and every tenant's
figures in Stats. docs/operations/auth.md is the operator's page.
"""

from __future__ import annotations

import dataclasses
import enum
import hmac
import ipaddress
import os
import socket
import stat
from collections.abc import Sequence
from pathlib import Path

from tierkv.config import AuthConfig, format_size, parse_size
from tierkv.config.schema import read_token_file_bytes
from tierkv.errors import ConfigError, TokenFileError
from tierkv.limits import MAX_AUTH_TOKEN_BYTES, MIN_GOOD_TOKEN_BYTES
from tierkv.vault.status import Abort, Status
from tierkv.vault.store import DEFAULT_TENANT, MAX_TENANTS, check_tenant

LINE_FORM = "'<token> <tenant> <admin|user> [quota]'"


class Access(str, enum.Enum):
    ADMIN = "admin"
    USER = "user"


@dataclasses.dataclass(frozen=True)
class Principal:
    tenant: str
    access: Access

    @property
    def admin(self) -> bool:
        return self.access is Access.ADMIN


OPEN = Principal(DEFAULT_TENANT, Access.ADMIN)
"""Every caller of a vault without tokens."""


class TokenTable:
    """Token → principal. An empty table means the vault is open."""

    def __init__(
        self,
        entries: dict[bytes, Principal],
        quotas: dict[str, int] | None = None,
        warnings: Sequence[str] = (),
    ) -> None:
        self._entries = list(entries.items())
        self.quotas = dict(quotas or {})
        self.warnings = tuple(warnings)
        """What is weak but usable (a guessable token, by its line), for the start-up log and config check."""

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    @property
    def tenants(self) -> dict[str, int]:
        """Every tenant named, with its quota (0: none)."""
        names = {p.tenant: 0 for _, p in self._entries}
        return {**names, **self.quotas}

    def describe(self) -> str:
        """What ``[auth]`` amounts to, in words an operator reads at start and in ``config check``."""
        if not self._entries:
            return (
                f"auth is OFF: no token file and no token in the environment, so every caller is an "
                f"admin of tenant {DEFAULT_TENANT!r} (set [auth] token_file to turn it on)"
            )
        tenants = len(self.tenants)
        return f"auth is on: {len(self._entries)} token(s), {tenants} tenant(s)"

    def check_budget(self, max_bytes: int, source: str) -> None:
        """ConfigError (naming ``vault.max_bytes``) when the quotas leave a tenant with a token no room.

        A tenant with a quota is never evicted by another tenant's writes, so quotas past the budget
        (or a budget they fill while some tenant has none) would let one tenant fill the vault and every
        other tenant's Puts be refused from then on."""
        quotas = sum(self.quotas.values())
        open_tenants = [t for t, quota in self.tenants.items() if not quota]
        if quotas > max_bytes or (open_tenants and quotas >= max_bytes):
            left = f"; tenant {open_tenants[0]!r} has no quota and would get nothing" if open_tenants else ""
            problem = (
                f"{format_size(max_bytes)} is less than the tenants' quotas need ({format_size(quotas)} "
                f"together{left}): a tenant with a quota is never evicted by the others' writes, so a "
                "tenant could fill the vault for good; lower the quotas in the token file or raise "
                "max_bytes"
            )
            raise ConfigError(source, "vault.max_bytes", problem)

    def principal(self, token: bytes | None) -> Principal:
        """Who sent ``token``; Abort(UNAUTHENTICATED) when the table is on and the token is not in it.

        Every entry is compared (in constant time), so the answer's timing does not say which matched.
        """
        if not self._entries:
            return OPEN
        sent = token or b""
        found: Principal | None = None
        for expected, who in self._entries:
            if hmac.compare_digest(sent, expected) and found is None:
                found = who
        if found is None:
            raise Abort(Status.UNAUTHENTICATED, "missing or wrong token")
        return found


def load_tokens(auth: AuthConfig, source: str = "auth") -> TokenTable:
    """The vault's token table from ``auth.token_file`` or ``$token_env``; a ConfigError otherwise."""
    if auth.token_file:
        return read_token_file(Path(auth.token_file).expanduser(), source)
    value = os.environ.get(auth.token_env, "").strip() if auth.token_env else ""
    if not value:
        return TokenTable({})
    try:
        token = check_token(value)
    except ValueError as exc:
        raise ConfigError(source, f"${auth.token_env}", str(exc)) from None
    return TokenTable({token: OPEN}, warnings=_guessable(token, f"${auth.token_env}"))


def read_token_file(path: Path, source: str = "auth") -> TokenTable:
    """The token table a file names (:func:`parse_token_file`); an unreadable file names ``source``."""
    try:
        raw = read_token_file_bytes(path)
    except OSError as exc:
        problem = f"cannot read the token file {path}: {exc.strerror or exc}"
        raise ConfigError(source, "auth.token_file", problem) from None
    return parse_token_file(raw, str(path))


def parse_token_file(raw: bytes, path: str) -> TokenTable:
    """The one parser of token files; every problem is a :class:`TokenFileError` naming its line."""
    lines = [(n, fields) for n, fields in _lines(_decode(raw, path)) if not fields[0].startswith("#")]
    if not lines:
        raise TokenFileError(
            path,
            0,
            "names no token (only blank lines and comments): a configured token file must hold at least "
            "one, or the vault would run open; remove [auth] token_file to run without auth",
        )
    if all(len(fields) == 1 for _, fields in lines):
        return _bare(lines, path)
    builder = _Builder(path)
    for number, fields in lines:
        builder.add(number, fields)
    return builder.table()


def _decode(raw: bytes, path: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise TokenFileError(path, line, f"not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None


def _lines(text: str) -> list[tuple[int, list[str]]]:
    return [(n, line.split()) for n, line in enumerate(text.splitlines(), start=1) if line.split()]


def _bare(lines: list[tuple[int, list[str]]], path: str) -> TokenTable:
    """The one-token form: the whole file is one bare token, an admin of the default tenant."""
    if len(lines) > 1:
        raise TokenFileError(
            path,
            lines[1][0],
            f"a second bare token: the one-token form is one token alone; for several tokens write "
            f"{LINE_FORM} lines",
        )
    number, (token,) = lines[0]
    checked = _checked(token, path, number)
    return TokenTable({checked: OPEN}, warnings=_guessable(checked, f"{path}:{number}"))


def check_token(token: str) -> bytes:
    """``token`` as sent on the wire; ValueError when no transport can carry it."""
    encoded = token.encode()
    if len(encoded) > MAX_AUTH_TOKEN_BYTES:
        raise ValueError(
            f"a token of {len(encoded)} bytes: the limit is {MAX_AUTH_TOKEN_BYTES} bytes (gRPC and the "
            f"bulk port alike)"
        )
    if not all(0x21 <= b <= 0x7E for b in encoded):
        raise ValueError("a token must be printable ASCII without spaces (gRPC metadata carries no other)")
    return encoded


def _guessable(token: bytes, where: str) -> tuple[str, ...]:
    """A warning naming ``where`` (never the token) when ``token`` is short enough to guess."""
    if len(token) >= MIN_GOOD_TOKEN_BYTES:
        return ()
    return (
        f"{where}: a token of {len(token)} bytes is guessable; use at least {MIN_GOOD_TOKEN_BYTES} random "
        f"bytes (e.g. openssl rand -hex 16)",
    )


def _checked(token: str, path: str, number: int) -> bytes:
    try:
        return check_token(token)
    except ValueError as exc:
        raise TokenFileError(path, number, str(exc)) from None


class _Builder:
    """The tenant-line form, line by line: every line checked against the ones before it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.entries: dict[bytes, Principal] = {}
        self.warnings: list[str] = []
        self.token_lines: dict[bytes, int] = {}
        self.quotas: dict[str, tuple[int, int]] = {}
        self.tenants = {DEFAULT_TENANT}

    def fail(self, number: int, problem: str) -> TokenFileError:
        return TokenFileError(self.path, number, problem)

    def add(self, number: int, fields: list[str]) -> None:
        if len(fields) == 1:
            raise self.fail(
                number,
                f"one word where the other lines are {LINE_FORM}: a bare token is valid only as the "
                f"whole file (a wrapped line?)",
            )
        if len(fields) not in (3, 4):
            raise self.fail(number, f"expected {LINE_FORM}, got {len(fields)} fields")
        token = _checked(fields[0], self.path, number)
        if token in self.token_lines:
            raise self.fail(number, f"this token is also on line {self.token_lines[token]}")
        who = Principal(self._tenant(number, fields[1]), self._access(number, fields[2]))
        if len(fields) == 4:
            self._quota(number, who.tenant, fields[3])
        self.entries[token] = who
        self.token_lines[token] = number
        self.warnings += _guessable(token, f"{self.path}:{number}")

    def _tenant(self, number: int, name: str) -> str:
        try:
            check_tenant(name)
        except ValueError as exc:
            raise self.fail(number, str(exc)) from None
        if name not in self.tenants and len(self.tenants) >= MAX_TENANTS:
            raise self.fail(
                number,
                f"tenant {name!r} is one too many: a vault holds at most {MAX_TENANTS} tenants, "
                f"{DEFAULT_TENANT!r} included",
            )
        self.tenants.add(name)
        return name

    def _access(self, number: int, role: str) -> Access:
        try:
            return Access(role)
        except ValueError:
            raise self.fail(number, f"the role must be admin or user, not {role!r}") from None

    def _quota(self, number: int, tenant: str, text: str) -> None:
        try:
            quota = parse_size(text)
        except ValueError as exc:
            raise self.fail(number, f"quota: {exc}") from None
        if quota <= 0:
            raise self.fail(number, f"quota {text!r}: a quota must be positive (leave it out for none)")
        seen = self.quotas.setdefault(tenant, (quota, number))
        if seen[0] != quota:
            raise self.fail(
                number,
                f"tenant {tenant!r} has quota {format_size(quota)} here and {format_size(seen[0])} on line "
                f"{seen[1]}",
            )

    def table(self) -> TokenTable:
        return TokenTable(self.entries, {t: q for t, (q, _) in self.quotas.items()}, self.warnings)


ALLOW_OPEN_ENV = "TIERKV_ALLOW_OPEN"
"""``1`` here does what ``[auth] allow_open = true`` does, for a vault a script starts without a config
file (in a network namespace of its own, say)."""


def is_loopback(host: str) -> bool | None:
    """Whether only this machine can reach ``host``: an address in 127.0.0.0/8 or ``::1``, or a name
    that resolves to such addresses only (``localhost``); None for a name that does not resolve (the
    start fails on that anyway, with its own message)."""
    literal = host.strip("[]")
    try:
        return ipaddress.ip_address(literal.split("%")[0]).is_loopback
    except ValueError:
        pass
    try:  # resolved as a bind resolves it: "*" is every interface there, as gRPC reads it too
        found = socket.getaddrinfo(literal, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return None
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in found)


def check_open(tokens: TokenTable, auth: AuthConfig, host: str, source: str) -> None:
    """ConfigError (naming ``vault.host``) for a vault with no token that would listen beyond loopback
    without ``[auth] allow_open``: fail closed, as a missing token file is more often an accident than a
    choice, and a KV cache holds what its users' prompts said."""
    if tokens.enabled or auth.allow_open or is_loopback(host) is not False:
        return
    allowed = os.environ.get(ALLOW_OPEN_ENV, "").strip().lower()
    if allowed in ("1", "true", "yes"):
        return
    raise ConfigError(
        source,
        "vault.host",
        f"{host} is reachable from other machines and auth is off (no [auth] token_file, no "
        f"${auth.token_env}): anyone who reaches the vault could read and write every tenant's KV; set "
        "[auth] token_file (docs/operations/auth.md), listen on 127.0.0.1, or set [auth] allow_open = true "
        f"(or ${ALLOW_OPEN_ENV}=1) on a trusted network",
    )


def exposure_warning(auth: AuthConfig) -> str | None:
    """A warning when the token file may be read or written by its group or others, else None."""
    if not auth.token_file:
        return None
    path = Path(auth.token_file).expanduser()
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    if not mode & 0o066:
        return None
    who = " and ".join(n for n, bits in (("its group", 0o060), ("others", 0o006)) if mode & bits)
    return (
        f"the token file {path} is open to {who} (mode {mode:04o}): whoever reads it holds its tokens; "
        f"chmod 600 {path}"
    )


def bearer_token(header: str | bytes | None) -> bytes | None:
    """The token of an ``authorization: Bearer <token>`` header value; None for any other value (the
    scheme is matched without regard to case, as HTTP does)."""
    if header is None:
        return None
    raw = header.encode() if isinstance(header, str) else bytes(header)
    scheme, space, token = raw.partition(b" ")
    return token if space and scheme.lower() == b"bearer" else None


__all__ = [
    "OPEN",
    "Access",
    "Principal",
    "TokenTable",
    "bearer_token",
    "check_token",
    "exposure_warning",
    "load_tokens",
    "parse_token_file",
    "read_token_file",
]
