"""Asking every vault of a config the same question in parallel, each vault's answer or its error apart.

Operator commands (``tierkv admin``), warm-start snapshots and the router's page listing all ask each
vault of ``[cluster]`` (or addresses given on the command line) with the config's token and TLS; one
vault's failure is that vault's answer, never the whole command's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from tierkv.client.vault import VaultClient
from tierkv.config import Config
from tierkv.endpoints import HostPort
from tierkv.errors import ConfigError, VaultError
from tierkv.roles import COLD_ROLES

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Target:
    role: str
    address: str


@dataclasses.dataclass(frozen=True)
class Answer(Generic[T]):
    """One vault's answer to one command, or the error it gave."""

    target: Target
    value: T | None = None
    error: VaultError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def error_dict(self) -> dict[str, Any]:
        code = self.error.code if self.error is not None else ""
        return {
            "role": self.target.role,
            "vault": self.target.address,
            "error": str(self.error),
            "code": code,
        }


def targets(config: Config, vaults: Sequence[str] = ()) -> list[Target]:
    """The vaults named on the command line, else every vault of the config (kv_cold, then ssm_cold)."""
    if vaults:
        try:
            return [Target("", HostPort.parse(v).address) for v in vaults]
        except ValueError as exc:
            raise ConfigError("command line", "--vault", str(exc)) from exc
    return [Target(str(role), address) for role in COLD_ROLES for address in config.cluster.addresses(role)]


def ask(
    config: Config, where: Sequence[Target], call: Callable[[VaultClient], T], timeout: float
) -> list[Answer[T]]:
    """``call`` on a client of each vault, in parallel; a vault's failure is its answer's error."""
    token = config.token()
    tls = config.tls if config.tls.enabled else None

    def one(target: Target) -> Answer[T]:
        with VaultClient(target.address, timeout=timeout, token=token, tls=tls) as client:
            try:
                return Answer(target, call(client))
            except VaultError as exc:
                return Answer(target, error=exc)

    with ThreadPoolExecutor(max_workers=max(1, len(where))) as pool:
        return list(pool.map(one, where))


__all__ = ["Answer", "Target", "ask", "targets"]
