"""The vaults a bench run talks to: the ones in tierkv.toml, or ones it starts itself on loopback.

``auto`` uses the configured vaults when every ``kv_cold`` vault answers a Stats RPC, and otherwise starts
its own (a ``kv_cold`` one, plus an ``ssm_cold`` one for hybrid shapes) under a temporary directory and
stops them (by PID, SIGTERM) when the run ends. ``config`` insists on the configured ones; ``local``
always starts its own. Measuring against configured vaults writes into them, in a namespace of its own
that the runner deletes afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tierkv.bench import BenchError
from tierkv.client.cluster import KV_COLD, SSM_COLD, Cluster
from tierkv.client.types import VaultStats
from tierkv.config import BUILTIN, Config
from tierkv.errors import VaultError
from tierkv.status import cluster_status, human_bytes
from tierkv.vault.launcher import VaultProcess

logger = logging.getLogger(__name__)

VAULT_MODES = ("auto", "config", "local")


@dataclasses.dataclass(frozen=True)
class VaultSettings:
    mode: str = "auto"
    state_dir: Path | None = None
    max_bytes: int = 1 << 30
    sync: str = "durable"
    timeout_s: float = 30.0

    def at_least(self, nbytes: int) -> VaultSettings:
        """Vaults started here get a budget of at least ``nbytes`` (configured ones keep theirs)."""
        if self.mode == "config" or self.max_bytes >= nbytes:
            return self
        return dataclasses.replace(self, max_bytes=nbytes)


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
    if settings.mode not in VAULT_MODES:
        raise BenchError(f"--vaults must be one of {', '.join(VAULT_MODES)}, got {settings.mode!r}")
    warnings: list[str] = []
    if settings.mode != "local":
        nodes = cluster_status(config, timeout=min(config.cluster.timeout, 5.0))
        kv = [n for n in nodes if n.role == KV_COLD]
        ssm = [n for n in nodes if n.role == SSM_COLD]
        usable = bool(kv) and all(n.reachable for n in kv)
        if usable:
            roles: dict[str, list[str]] = {KV_COLD: [n.address for n in kv]}
            live_ssm = [n.address for n in ssm if n.reachable]
            if live_ssm:
                roles[SSM_COLD] = live_ssm
            if len(live_ssm) < len(ssm):
                warnings.append("some ssm_cold vaults are unreachable; state goes to the reachable ones")
            elif need_ssm and not ssm:
                warnings.append("no ssm_cold vault configured: recurrent state goes to kv_cold")
            warnings.append("measured on the configured vaults: other traffic on them shares the figures")
            with Cluster.from_config(config, timeout=cluster_timeout) as cluster:
                cluster_set = VaultSet(cluster, "config", roles, config.source, warnings)
                cluster_set.notes.append(f"vaults from {config.source}")
                yield cluster_set
            return
        down = ", ".join(f"{n.role} {n.address}" for n in nodes if not n.reachable) or "none configured"
        if settings.mode == "config":
            raise BenchError(f"configured vaults unreachable ({down}); use --vaults local to start some")
        if config.source != BUILTIN:
            warnings.append(f"configured vaults unreachable ({down}): started vaults on loopback instead")
    with _local_vaults(settings, need_ssm, warnings, cluster_timeout) as vaults:
        yield vaults


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
                proc = VaultProcess(base / role, role=role, max_bytes=settings.max_bytes, sync=settings.sync)
                procs[role] = proc
                try:
                    proc.start(timeout=settings.timeout_s)
                except (RuntimeError, TimeoutError) as exc:
                    raise BenchError(f"could not start a {role} vault: {exc}") from exc
                logger.info("started %s vault on %s (LMDB in %s)", role, proc.address, proc.path)
            addresses = {role: [procs[role].address] for role in roles}
            note = (
                f"started on loopback for this run (sync={settings.sync}, budget "
                f"{human_bytes(settings.max_bytes)} each, LMDB under {base}) and stopped afterwards"
            )
            with Cluster(addresses, timeout=cluster_timeout) as cluster:
                yield VaultSet(cluster, "local", addresses, "self-started", warnings, [note])
        finally:
            for role, proc in procs.items():
                code = proc.stop()
                if code != 0:
                    logger.warning("%s vault exited with %d:\n%s", role, code, proc.log_tail())


__all__ = ["VAULT_MODES", "VaultSet", "VaultSettings", "counter_delta", "open_vaults", "watched_vaults"]
