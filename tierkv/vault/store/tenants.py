"""Tenants of one store: their databases, quotas and committed figures.

Each tenant has its own five databases, so one tenant's namespace never reaches another's entries; the
``default`` tenant uses the unprefixed ones (stores from before tenancy open unchanged). A store knows the
default tenant, every configured one and every one found in the file (those without a quota).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from tierkv.vault.policy import Learner
from tierkv.vault.store.env import MAX_TENANTS, StoreEnv
from tierkv.vault.store.format import tenant_databases, tenants_in

DEFAULT_TENANT = "default"
_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class UnknownTenantError(KeyError):
    """A call named a tenant this store does not have."""


def check_tenant(name: str) -> str:
    """``name`` if it can name a tenant (letters, digits, ``_.-``, at most 64); ValueError otherwise."""
    if not _TENANT_NAME.fullmatch(name):
        raise ValueError(f"tenant name {name!r} must be 1-64 letters, digits, '_', '.' or '-'")
    return name


@dataclasses.dataclass(eq=False)
class Tenant:
    """One tenant's LMDB databases, its quota and its committed figures."""

    name: str
    data: Any
    index: Any
    order: Any
    expiry: Any
    tokens: Any = None
    quota: int = 0
    used: int = 0
    count: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    corrupt: int = 0
    expired: int = 0
    overflow: int = 0
    protected: int = 0
    proven: int = 0
    """Committed bytes of unprotected entries marked proven (``adaptive``'s main part)."""
    classes: Counter[str] = dataclasses.field(default_factory=Counter)
    """Committed bytes per tagged source class (untagged bytes are ``used`` minus their sum)."""
    class_keys: Counter[str] = dataclasses.field(default_factory=Counter)
    class_protected: Counter[str] = dataclasses.field(default_factory=Counter)
    learner: Learner | None = None
    """What a learning policy learns about this tenant (None under one that does not learn): kept here
    because a Put asks it once or more per block."""

    @property
    def meta_suffix(self) -> bytes:
        return b"/" + self.name.encode()

    @property
    def databases(self) -> tuple[Any, ...]:
        return (self.data, self.index, self.order, self.expiry, self.tokens)


class Tenants:
    """The store's tenants by name, in a fixed order (the default tenant first)."""

    def __init__(self, env: StoreEnv, quotas: Mapping[str, int]) -> None:
        with env.env.begin() as txn:
            found = tenants_in(txn)
        names = [DEFAULT_TENANT, *sorted((set(quotas) | found) - {DEFAULT_TENANT})]
        if len(names) > MAX_TENANTS:
            raise ValueError(f"at most {MAX_TENANTS} tenants per store, {len(names)} given or found")
        self._by_name: dict[str, Tenant] = {}
        for name in names:
            check_tenant(name)
            data, index, order, expiry, tokens = (
                env.open_db(db) for db in tenant_databases(name, name == DEFAULT_TENANT)
            )
            quota = max(0, int(quotas.get(name, 0)))
            self._by_name[name] = Tenant(name, data, index, order, expiry, tokens, quota=quota)

    def __getitem__(self, name: str) -> Tenant:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownTenantError(f"no tenant {name!r} in this store") from None

    def __len__(self) -> int:
        return len(self._by_name)

    def __iter__(self) -> Iterator[Tenant]:
        return iter(self._by_name.values())

    def all(self) -> list[Tenant]:
        return list(self._by_name.values())

    def names(self) -> list[str]:
        return list(self._by_name)

    def pick(self, name: str | None) -> list[Tenant]:
        """One tenant, or every tenant when None."""
        return self.all() if name is None else [self[name]]

    @property
    def default(self) -> Tenant:
        return self._by_name[DEFAULT_TENANT]


__all__ = ["DEFAULT_TENANT", "Tenant", "Tenants", "UnknownTenantError", "check_tenant"]
