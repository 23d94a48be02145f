"""Who is calling: tokens map to a tenant and an access role, checked in constant time on every call.

The vault reads ``auth.token_file`` (or ``$TIERKV_TOKEN``). A file of one bare token keeps its old
meaning: that token is an admin of the ``default`` tenant. Otherwise each line is::

    <token> <tenant> <admin|user> [quota]

e.g. ``s3cr3t-a acme user 2GiB``. ``quota`` caps the tenant's stored bytes (the same on every line of a
tenant, or given once). Blank lines and lines starting with ``#`` are skipped. With no token at all the
vault is open and every caller is an admin of the default tenant. Health checks never need a token.

A ``user`` works only in its own tenant's namespaces; an ``admin`` may also flush everything, act in
another tenant's namespaces (Delete / Flush naming a tenant) and sees the store path and every tenant's
figures in Stats.
"""

from __future__ import annotations

import dataclasses
import enum
import hmac
import os
from pathlib import Path

from tierkv.config import AuthConfig, parse_size
from tierkv.errors import ConfigError
from tierkv.vault.status import Abort, Status
from tierkv.vault.store import DEFAULT_TENANT, check_tenant


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

    def __init__(self, entries: dict[bytes, Principal], quotas: dict[str, int] | None = None) -> None:
        self._entries = list(entries.items())
        self.quotas = dict(quotas or {})

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    @property
    def tenants(self) -> dict[str, int]:
        """Every tenant named, with its quota (0: none)."""
        names = {p.tenant: 0 for _, p in self._entries}
        return {**names, **self.quotas}

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
    """The vault's token table from ``auth.token_file`` or ``$token_env``; ConfigError names the line."""
    if auth.token_file:
        token = auth.load_token(source)  # reads and checks the file (missing, unreadable, empty)
        path = Path(auth.token_file).expanduser()
        return parse_token_lines(token or "", f"{source}: auth.token_file {path}")
    value = os.environ.get(auth.token_env, "").strip() if auth.token_env else ""
    return TokenTable({value.encode(): OPEN} if value else {})


def parse_token_lines(text: str, where: str) -> TokenTable:
    entries: dict[bytes, Principal] = {}
    quotas: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        token, who, quota = _parse_line(fields, f"{where}, line {number}")
        if token in entries:
            raise ConfigError(where, f"line {number}", "this token is listed twice")
        entries[token] = who
        if quota is not None:
            if quotas.get(who.tenant, quota) != quota:
                raise ConfigError(where, f"line {number}", f"tenant {who.tenant!r} has two different quotas")
            quotas[who.tenant] = quota
    return TokenTable(entries, quotas)


def _parse_line(fields: list[str], where: str) -> tuple[bytes, Principal, int | None]:
    if len(fields) == 1:
        return fields[0].encode(), OPEN, None
    if len(fields) not in (3, 4):
        raise ConfigError(
            where, "format", "expected '<token> <tenant> <admin|user> [quota]' or one bare token"
        )
    token, tenant, access = fields[:3]
    if access not in ("admin", "user"):
        raise ConfigError(where, "role", f"expected admin or user, got {access!r}")
    try:
        who = Principal(check_tenant(tenant), Access(access))
        quota = parse_size(fields[3]) if len(fields) == 4 else None
    except ValueError as exc:
        raise ConfigError(where, "format", str(exc)) from exc
    return token.encode(), who, quota


def bearer_token(header: str | bytes | None) -> bytes | None:
    """The token of an ``authorization: Bearer <token>`` header value."""
    if header is None:
        return None
    raw = header.encode() if isinstance(header, str) else bytes(header)
    return raw[7:] if raw.startswith(b"Bearer ") else raw


__all__ = ["OPEN", "Access", "Principal", "TokenTable", "bearer_token", "load_tokens", "parse_token_lines"]
