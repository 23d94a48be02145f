"""The vaults a bench run talks to: ones it starts on loopback (the default), or ones it is told to use.

A bench writes gigabytes and can evict real entries, so it never goes near a vault unless asked:

- ``local`` (default): a ``kv_cold`` vault (plus an ``ssm_cold`` one for hybrid shapes) on 127.0.0.1,
  a free port each, LMDB under a temporary directory, stopped (by PID, SIGTERM) when the run ends;
- ``config`` (``--use-config-vaults``): the vaults in tierkv.toml, every ``kv_cold`` one must answer;
- ``given`` (``--vaults kv_cold=HOST:PORT,...``): those vaults, with tierkv.toml's token and TLS;
- ``auto``: the configured vaults when they all answer, else self-started ones (the pre-0.3 default).

Measuring against vaults that were not started here writes into them, in a namespace of its own that
the run deletes afterwards; the run says so in its warnings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from tierkv.bench import BenchError
from tierkv.client.cluster import Cluster
from tierkv.client.types import VaultStats
from tierkv.config import BUILTIN, Config, human_bytes
from tierkv.endpoints import HostPort
from tierkv.errors import VaultError
from tierkv.roles import COLD_ROLE_NAMES, Role
from tierkv.vault.launcher import VaultProcess

logger = logging.getLogger(__name__)

KV_COLD, SSM_COLD = Role.KV_COLD.value, Role.SSM_COLD.value

VAULT_MODES = ("local", "config", "auto")
"""Keywords ``--vaults`` takes besides a list of addresses (which is mode ``given``)."""

PROBE_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class VaultSettings:
    mode: str = "local"
    state_dir: Path | None = None
    max_bytes: int = 1 << 30
    sync: str = "durable"
    timeout_s: float = 30.0
    addresses: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    host: str = "127.0.0.1"
    """Where vaults started here listen (a link's vault side, under ``--link``)."""
    launch_prefix: tuple[str, ...] = ()
    """Put before the command of vaults started here (``ip netns exec NS`` under ``--link``)."""

    def __post_init__(self) -> None:
        if self.mode not in (*VAULT_MODES, "given"):
            raise BenchError(f"--vaults must be one of {', '.join(VAULT_MODES)} or ROLE=HOST:PORT,...")
        if (self.mode == "given") != bool(self.addresses):
            raise BenchError("vault addresses go with mode 'given', and only with it")

    def at_least(self, nbytes: int) -> VaultSettings:
        """Vaults started here get a budget of at least ``nbytes`` (vaults not started here keep theirs)."""
        if self.mode in ("config", "given") or self.max_bytes >= nbytes:
            return self
        return dataclasses.replace(self, max_bytes=nbytes)

    def remote(self, config: Config) -> list[tuple[str, str]]:
        """(role, address) of every vault this run would use without starting it (none for ``local``)."""
        if self.mode == "local":
            return []
        if self.mode == "given":
            return [(role, a) for role, addresses in self.addresses.items() for a in addresses]
        cc = config.cluster
        return [(KV_COLD, e.address) for e in cc.kv_cold] + [(SSM_COLD, e.address) for e in cc.ssm_cold]


def parse_vaults(text: str) -> tuple[str, dict[str, tuple[str, ...]]]:
    """``--vaults``: a mode keyword, or ``kv_cold=HOST:PORT,ssm_cold=HOST:PORT,...`` (a role may repeat;
    IPv6 as ``[addr]:port``). Returns (mode, addresses by role); BenchError saying what was expected."""
    word = text.strip()
    if word in VAULT_MODES:
        return word, {}
    found: dict[str, list[str]] = {}
    for item in filter(None, (part.strip() for part in word.split(","))):
        role, sep, address = item.partition("=")
        try:
            if not sep:
                raise ValueError(f"expected {', '.join(VAULT_MODES)} or ROLE=HOST:PORT,..., got {item!r}")
            parsed = Role.parse(role.strip())
            if not parsed.cold:
                raise ValueError(f"vaults serve {' or '.join(COLD_ROLE_NAMES)}, not {role.strip()!r}")
            found.setdefault(parsed.value, []).append(HostPort.parse(address).address)
        except ValueError as exc:
            raise BenchError(f"--vaults: {exc}") from None
    if KV_COLD not in found:
        raise BenchError(
            f"--vaults takes {', '.join(VAULT_MODES)} or kv_cold=HOST:PORT[,ssm_cold=HOST:PORT...], "
            f"got {text!r}"
        )
    return "given", {role: tuple(addresses) for role, addresses in found.items()}


@dataclasses.dataclass
class VaultSet:
    """An open cluster and where its vaults came from."""

    cluster: Cluster
    source: str
    addresses: dict[str, list[str]]
    config_source: str
    warnings: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def stats(self) -> list[dict[str, Any]]:
        """One Stats RPC per vault: role, address and the counters (or the error)."""
        rows: list[dict[str, Any]] = []
        for role, address, st in self.cluster.stats():
            if isinstance(st, VaultError):
                rows.append({"role": role, "address": address, "error": str(st)})
            else:
                rows.append({"role": role, "address": address, **_stats_dict(st)})
        return rows

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "config": self.config_source,
            "addresses": self.addresses,
            "notes": self.notes,
            "warnings": self.warnings,
        }


def _stats_dict(st: VaultStats) -> dict[str, Any]:
    d = dataclasses.asdict(st)
    d["hit_rate"] = st.hit_rate
    return d


def counter_delta(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, int]:
    """Sums over vaults of what changed during the run (keys, hits, misses, evictions, bytes, corrupt)."""
    names = ("keys", "used_bytes", "hits", "misses", "evictions", "corrupt", "bytes_in", "bytes_out")
    first = {(r["role"], r["address"]): r for r in before if "error" not in r}
    delta = dict.fromkeys(names, 0)
    for row in after:
        old = first.get((row["role"], row["address"]))
        if old is None or "error" in row:
            continue
        for name in names:
            delta[name] += int(row[name]) - int(old[name])
    return delta


@contextlib.contextmanager
def open_vaults(
    config: Config, settings: VaultSettings, *, need_ssm: bool, cluster_timeout: float = 60.0
) -> Iterator[VaultSet]:
    """Yield a :class:`VaultSet`; self-started vaults are stopped on the way out, whatever happened."""
    warnings: list[str] = []
    roles = _remote_roles(config, settings, need_ssm, warnings)
    if roles is None:
        with _local_vaults(settings, need_ssm, warnings, cluster_timeout) as vaults:
            yield vaults
        return
    source = "given" if settings.mode == "given" else "config"
    named = "by --vaults" if source == "given" else f"in {config.source}"
    warnings.append(
        f"measured on the vaults named {named}: the run writes into them (in a namespace of its own, "
        "deleted afterwards), can evict their entries, and other traffic on them shares the figures"
    )
    with Cluster.from_config(config, roles, timeout=cluster_timeout) as cluster:
        yield VaultSet(cluster, source, roles, config.source, warnings, [f"vaults named {named}"])


def _remote_roles(
    config: Config, settings: VaultSettings, need_ssm: bool, warnings: list[str]
) -> dict[str, list[str]] | None:
    """The addresses by role of the vaults to use (each asked for Stats first), or None to start some."""
    pairs = settings.remote(config)
    if not pairs:
        return None
    roles: dict[str, list[str]] = {}
    for role, address in pairs:
        roles.setdefault(role, []).append(address)
    with Cluster.from_config(config, roles, timeout=min(config.cluster.timeout, PROBE_TIMEOUT_S)) as probe:
        down = [(role, address) for role, address, st in probe.stats() if isinstance(st, VaultError)]
    if KV_COLD in roles and all(role != KV_COLD for role, _ in down):
        return _reachable_roles(roles, down, need_ssm, warnings)
    named = ", ".join(f"{role} {address}" for role, address in down)
    if settings.mode != "auto":
        raise BenchError(
            f"vaults unreachable ({named}); without --vaults / --use-config-vaults the run starts its own"
        )
    if config.source != BUILTIN:
        warnings.append(f"configured vaults unreachable ({named}): started vaults on loopback instead")
    return None


def _reachable_roles(
    roles: dict[str, list[str]], down: list[tuple[str, str]], need_ssm: bool, warnings: list[str]
) -> dict[str, list[str]]:
    """Every ``kv_cold`` vault (all answered) and the ``ssm_cold`` ones that answered."""
    live_ssm = [a for a in roles.get(SSM_COLD, []) if (SSM_COLD, a) not in down]
    if down:
        warnings.append("some ssm_cold vaults are unreachable; state goes to the reachable ones")
    elif need_ssm and not live_ssm:
        warnings.append("no ssm_cold vault given: recurrent state goes to kv_cold")
    return {KV_COLD: roles[KV_COLD], **({SSM_COLD: live_ssm} if live_ssm else {})}


@contextlib.contextmanager
def watched_vaults(
    config: Config,
    settings: VaultSettings,
    *,
    need_ssm: bool,
    record: dict[str, Any],
    warnings: list[str],
) -> Iterator[VaultSet]:
    """:func:`open_vaults`, with where they are and their counters before, after and the change put in
    ``record``, and their warnings added to ``warnings``, so a run's figures carry the vaults' side."""
    with open_vaults(config, settings, need_ssm=need_ssm) as vaults:
        before = vaults.stats()
        record.update(vaults.describe(), before=before)
        yield vaults
        after = vaults.stats()
        record.update(after=after, delta=counter_delta(before, after))
        warnings.extend(vaults.warnings)


class _CarriesVaults(Protocol):
    vaults: dict[str, Any]
    warnings: list[str]


R = TypeVar("R", bound=_CarriesVaults)


def measured_on(config: Config, settings: VaultSettings, *, need_ssm: bool, run: Callable[[Cluster], R]) -> R:
    """``run`` on the vaults of ``settings`` (:func:`watched_vaults`); its result's ``vaults`` gets their
    counters and its ``warnings`` theirs."""
    record: dict[str, Any] = {}
    warnings: list[str] = []
    with watched_vaults(config, settings, need_ssm=need_ssm, record=record, warnings=warnings) as found:
        result = run(found.cluster)
    result.vaults.update(record)
    result.warnings.extend(warnings)
    return result


@contextlib.contextmanager
def _local_vaults(
    settings: VaultSettings, need_ssm: bool, warnings: list[str], cluster_timeout: float
) -> Iterator[VaultSet]:
    with contextlib.ExitStack() as stack:
        if settings.state_dir is None:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tierkv-bench-")))
        else:
            base = settings.state_dir
            base.mkdir(parents=True, exist_ok=True)
        roles = [KV_COLD, SSM_COLD] if need_ssm else [KV_COLD]
        procs: dict[str, VaultProcess] = {}
        try:
            for role in roles:
                proc = VaultProcess(
                    base / role,
                    role=role,
                    host=settings.host,
                    max_bytes=settings.max_bytes,
                    sync=settings.sync,
                    prefix=settings.launch_prefix,
                    allow_open=bool(settings.launch_prefix),  # a link's namespace: nothing else reaches it
                )
                procs[role] = proc
                try:
                    proc.start(timeout=settings.timeout_s)
                except (RuntimeError, TimeoutError) as exc:
                    raise BenchError(f"could not start a {role} vault: {exc}") from exc
                logger.info("started %s vault on %s (LMDB in %s)", role, proc.address, proc.path)
            addresses = {role: [procs[role].address] for role in roles}
            where = "on loopback" if settings.host == "127.0.0.1" else f"on {settings.host}"
            note = (
                f"started {where} for this run (sync={settings.sync}, budget "
                f"{human_bytes(settings.max_bytes)} each, LMDB under {base}) and stopped afterwards"
            )
            with Cluster(addresses, timeout=cluster_timeout) as cluster:
                yield VaultSet(cluster, "local", addresses, "self-started", warnings, [note])
        finally:
            for role, proc in procs.items():
                code = proc.stop()
                if code != 0:
                    logger.warning("%s vault exited with %d:\n%s", role, code, proc.log_tail())


__all__ = [
    "VAULT_MODES",
    "VaultSet",
    "VaultSettings",
    "counter_delta",
    "measured_on",
    "open_vaults",
    "parse_vaults",
    "watched_vaults",
]
