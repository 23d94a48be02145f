"""``tierkv status``: ask every configured vault over RPC how it is doing.

A node's ``state`` is ``ok``, ``serves ROLE`` (a vault of another role at that address), ``auth refused``
(it answered but refused our token: fix ``[auth]`` or ``$TIERKV_TOKEN``, not the network) or
``unreachable``. ``auth`` says whether the vault asks for a token at all: ``off`` when it answered a
Stats call that carried none (anyone who reaches it is an admin of its default tenant), ``on`` when it
refused that call, empty when it could not be asked.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rich.table import Table

from tierkv.client.vault import VaultClient
from tierkv.config import Config, VaultConfig, human_bytes
from tierkv.errors import AuthError, VaultError
from tierkv.roles import COLD_ROLES, Role

UNREACHABLE = "unreachable"
AUTH_REFUSED = "auth refused"


@dataclasses.dataclass(frozen=True)
class NodeStatus:
    role: str
    address: str
    reachable: bool
    state: str = "ok"
    rtt_ms: float | None = None
    error: str = ""
    serving_role: str = ""
    version: str = ""
    keys: int = 0
    used_bytes: int = 0
    max_bytes: int = 0
    hits: int = 0
    misses: int = 0
    hit_rate: float | None = None
    evictions: int = 0
    corrupt: int = 0
    uptime_s: float = 0.0
    sync_mode: str = ""
    bulk_port: int = 0
    """The vault's bulk data plane (0: none, BatchGet, Put and PrefixLookup go over gRPC)."""
    bulk_put: bool = False
    bulk_lookup: bool = False
    expired: int = 0
    protected_bytes: int = 0
    protected_overflow: int = 0
    classes: tuple[dict[str, Any], ...] = ()
    """Per tenant and source class: keys, bytes, hits, misses, expired and the 5-minute hit rate."""
    tenant: str = ""
    """The tenant the token belongs to (its figures are the tenant's own unless ``access`` is admin)."""
    access: str = ""
    leases: dict[str, int] = dataclasses.field(default_factory=dict)
    """Lookup leases: granted, honoured, expired, refused since start; held and leased bytes now."""
    auth: str = ""
    """``on``, ``off`` (the vault answers callers without a token) or empty (not known)."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def probe(role: Role, address: str, config: Config, timeout: float, token: str | None) -> NodeStatus:
    """One Stats call; a refused token and an unreachable vault are told apart."""
    tls = config.tls if config.tls.enabled else None
    with VaultClient(address, timeout=timeout, token=token, tls=tls) as client:
        start = time.perf_counter()
        try:
            s = client.stats()
        except VaultError as exc:
            state = AUTH_REFUSED if isinstance(exc, AuthError) else UNREACHABLE
            return NodeStatus(role=str(role), address=address, reachable=False, state=state, error=str(exc))
        rtt = (time.perf_counter() - start) * 1000
        auth = _auth_state(address, config, timeout) if token else "off"
    return NodeStatus(
        role=str(role),
        address=address,
        reachable=True,
        rtt_ms=round(rtt, 2),
        serving_role=s.role,
        version=s.version,
        keys=s.keys,
        used_bytes=s.used_bytes,
        max_bytes=s.max_bytes,
        hits=s.hits,
        misses=s.misses,
        hit_rate=s.hit_rate,
        evictions=s.evictions,
        corrupt=s.corrupt,
        uptime_s=round(s.uptime_s, 1),
        sync_mode=s.sync_mode,
        bulk_port=s.bulk_port,
        bulk_put=s.bulk_put,
        bulk_lookup=s.bulk_lookup,
        state="ok" if s.role == role else f"serves {s.role}",
        expired=s.expired,
        protected_bytes=s.protected_bytes,
        protected_overflow=s.protected_overflow,
        tenant=s.tenant,
        access=s.access,
        classes=tuple({**dataclasses.asdict(c), "hit_rate_5m": c.hit_rate_5m} for c in s.classes),
        leases=dataclasses.asdict(s.leases),
        auth=auth,
    )


def _auth_state(address: str, config: Config, timeout: float) -> str:
    """Whether a vault that took our token would also answer without one: what "auth off" means."""
    tls = config.tls if config.tls.enabled else None
    with VaultClient(address, timeout=timeout, tls=tls) as anonymous:
        try:
            anonymous.stats()
        except AuthError:
            return "on"
        except VaultError:
            return ""
    return "off"


def cluster_status(config: Config, timeout: float | None = None) -> list[NodeStatus]:
    """One Stats RPC per configured vault, in parallel. A bad ``[auth]`` is a ConfigError, before any call."""
    t = timeout or config.cluster.timeout
    token = config.token()
    nodes = [(role, address) for role in COLD_ROLES for address in config.cluster.addresses(role)]
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return list(pool.map(lambda n: probe(n[0], n[1], config, t, token), nodes))


def unlisted_vault(config: Config) -> str:
    """What to say when the file's own ``[vault]`` serves on a port no ``[cluster]`` vault has ('' if
    none): a file whose vault moved off 50051 while ``[cluster]`` (or its default) still names 50051, so
    that status asks a port where nothing listens."""
    vc = config.vault
    endpoints = (*config.cluster.kv_cold, *config.cluster.ssm_cold)
    if vc == VaultConfig() or not vc.port or vc.port in {e.port for e in endpoints}:
        return ""
    role = config.cluster.role if config.cluster.role.cold else Role.KV_COLD
    listed = ", ".join(e.address for e in endpoints) or "none"
    return (
        f"{config.source}: its [vault] serves on port {vc.port}, which no [cluster] vault has (they are: "
        f"{listed}); name that vault under [cluster.{role}] to ask it"
    )


def refused_hint(config: Config) -> str:
    """What to do about a vault that refused the token: send one, or send the one it knows."""
    auth = config.auth
    where = f"[auth] token_file {auth.token_file}" if auth.token_file else f"${auth.token_env}"
    if config.token() is None:
        return f"this side sent no token: set [auth] token_file in {config.source}, or ${auth.token_env}"
    return f"the token from {where} is not one that vault accepts (its [auth] token_file lists those it does)"


NARROW = 110
"""Below this many columns the table keeps what an operator reads first: the wider columns go to --json."""


def status_table(nodes: list[NodeStatus], title: str, width: int | None = None) -> Table:
    """One row per vault (and per source class under it). At ``width`` below :data:`NARROW` columns the
    round trip, version, evictions and corrupt columns are left out (``--json`` has them) so the role and
    address are never cut."""
    narrow = width is not None and width < NARROW
    table = Table(title=title)
    for col in ("role", "vault", "state"):
        table.add_column(col, no_wrap=True)
    extra = () if narrow else ("rtt ms", "version")
    tail = () if narrow else ("evictions", "corrupt")
    for col in (*extra, "keys", "used / capacity", "hit rate", *tail):
        table.add_column(col, justify="right")
    for n in nodes:
        if not n.reachable:
            table.add_row(n.role, n.address, f"[red]{n.state}[/red]", *[""] * (len(table.columns) - 3))
            continue
        state = "[green]ok[/green]" if n.state == "ok" else f"[yellow]{n.state}[/yellow]"
        if n.auth == "off":
            state += ", [red]auth OFF[/red]"
        rate = "—" if n.hit_rate is None else f"{n.hit_rate:.1%}"
        cells = {
            "rtt ms": f"{n.rtt_ms:.2f}",
            "version": n.version,
            "keys": f"{n.keys:,}",
            "used / capacity": f"{human_bytes(n.used_bytes)} / {human_bytes(n.max_bytes)}",
            "hit rate": rate,
            "evictions": f"{n.evictions:,}",
            "corrupt": f"[red]{n.corrupt}[/red]" if n.corrupt else "0",
        }
        table.add_row(n.role, n.address, state, *(cells[str(c.header)] for c in table.columns[3:]))
        _class_rows(table, n)
    return table


def _class_rows(table: Table, n: NodeStatus) -> None:
    """One indented row per source class under its vault: keys, bytes, 5-minute hit rate; the
    evictions column shows expired lookups."""
    if len(n.classes) == 1 and not n.classes[0]["source"]:
        return  # only untagged blocks: nothing the vault's own row does not say
    for c in n.classes:
        rate = "—" if c["hit_rate_5m"] is None else f"{c['hit_rate_5m']:.1%} (5m)"
        pinned = (
            f" [cyan]{human_bytes(c['protected_bytes'])} protected[/cyan]" if c["protected_bytes"] else ""
        )
        name = c["source"] or "(untagged)"
        cells = {
            "keys": f"{c['keys']:,}",
            "used / capacity": human_bytes(c["bytes"]) + pinned,
            "hit rate": rate,
            "evictions": f"{c['expired']:,} expired" if c["expired"] else "",
        }
        rest = (cells.get(str(col.header), "") for col in table.columns[3:])
        table.add_row("", f"  {c['tenant']}/{name}", "", *rest)
