"""The inference side's view of all vaults: roles, sharding, replication, deadlines, breakers.

``Cluster`` is what engine hooks call. It never raises because a vault failed: a vault that is down, slow
(past its deadline) or refusing us turns its keys into misses, is counted, and after a few failures its
circuit breaker stops further calls until a probe succeeds. Every operation fans out to the vaults
involved in parallel, one RPC per vault (one BatchGet per vault per restore).

Routing: attention and sliding-window KV go to the ``kv_cold`` role, SSM / linear-attention / conv states
to ``ssm_cold`` (or to ``kv_cold`` when no ``ssm_cold`` vault is configured). Within a role, keys are
sharded by rendezvous hashing; with ``replication`` r, writes go to the key's r owners and reads take the
first healthy owner that has the key.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from tierkv.client._rpc import Items, as_bytes
from tierkv.client.breaker import CircuitBreaker
from tierkv.client.metrics import ClusterMetrics
from tierkv.client.sharding import Rendezvous
from tierkv.client.types import VaultStats
from tierkv.client.vault import VaultClient
from tierkv.config import Config, TLSConfig
from tierkv.errors import VaultError
from tierkv.wire.framing import Buffer

log = logging.getLogger(__name__)

T = TypeVar("T")
KV_COLD = "kv_cold"
SSM_COLD = "ssm_cold"
ROLES = (KV_COLD, SSM_COLD)
_SSM_GROUPS = {"ssm", "conv", "linear", "linear_attention", "mamba", "recurrent"}


class _Failed(enum.Enum):
    FAILED = 0


FAILED = _Failed.FAILED


class _Member:
    def __init__(self, address: str, client: VaultClient, breaker: CircuitBreaker) -> None:
        self.address = address
        self.client = client
        self.breaker = breaker


class Cluster:
    """All vaults by role. ``roles`` maps ``"kv_cold"``/``"ssm_cold"`` to one address or a list."""

    def __init__(
        self,
        roles: Mapping[str, Sequence[str] | str],
        *,
        timeout: float = 2.0,
        token: str | None = None,
        tls: TLSConfig | None = None,
        replication: int = 1,
        breaker_threshold: int = 3,
        breaker_backoff_s: float = 1.0,
        **client_options: Any,
    ) -> None:
        unknown = set(roles) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown roles {sorted(unknown)}; expected {ROLES}")
        self.replication = max(1, replication)
        self.timeout = timeout
        self.metrics = ClusterMetrics()
        self._members: dict[str, list[_Member]] = {}
        self._rings: dict[str, Rendezvous] = {}
        for role, addresses in roles.items():
            addrs = [addresses] if isinstance(addresses, str) else list(addresses)
            if not addrs:
                continue
            self._members[role] = [
                _Member(
                    a,
                    VaultClient(a, timeout=timeout, token=token, tls=tls, **client_options),
                    CircuitBreaker(threshold=breaker_threshold, backoff_s=breaker_backoff_s),
                )
                for a in addrs
            ]
            self._rings[role] = Rendezvous(addrs)
        if KV_COLD not in self._members:
            raise ValueError("a cluster needs at least one kv_cold vault")
        size = sum(len(m) for m in self._members.values())
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * size), thread_name_prefix="tierkv-cluster")
        self._fallback_logged = threading.Event()

    @classmethod
    def from_config(
        cls, config: Config, roles: Mapping[str, Sequence[str]] | None = None, **overrides: Any
    ) -> Cluster:
        """Build from ``[cluster]`` of tierkv.toml, with the token from ``[auth]`` and TLS from ``[tls]``.

        ``roles`` replaces the file's vault addresses (engine hooks that take them inline pass them here).
        """
        cc = config.cluster
        options: dict[str, Any] = {
            "timeout": cc.timeout,
            "replication": cc.replication,
            "token": config.auth.load_token(),
            "tls": config.tls if config.tls.enabled else None,
        }
        options.update(overrides)
        if roles is None:
            roles = {KV_COLD: [e.address for e in cc.kv_cold], SSM_COLD: [e.address for e in cc.ssm_cold]}
        return cls(roles, **options)

    # -- routing -----------------------------------------------------------------------------------

    def role_for(self, layer_group: object) -> str:
        """The role that stores a layer group (an enum member or its name)."""
        name = getattr(layer_group, "name", layer_group)
        return SSM_COLD if str(name).lower() in _SSM_GROUPS else KV_COLD

    def _resolve(self, role: str) -> str:
        if role in self._members:
            return role
        if role == SSM_COLD:
            if not self._fallback_logged.is_set():
                self._fallback_logged.set()
                log.info("no ssm_cold vault configured: SSM state goes to kv_cold")
            return KV_COLD
        raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")

    def members(self, role: str) -> list[str]:
        return [m.address for m in self._members.get(role, [])]

    # -- fan-out -----------------------------------------------------------------------------------

    def _call(self, member: _Member, method: str, fn: Callable[[VaultClient], T]) -> T | _Failed:
        if not member.breaker.allow():
            self.metrics.skipped.labels(member.address).inc()
            return FAILED
        start = time.perf_counter()
        try:
            result = fn(member.client)
        except VaultError as exc:
            member.breaker.failure()
            self.metrics.failures.labels(member.address, method).inc()
            log.warning("%s on %s failed, treating as miss: %s", method, member.address, exc)
            return FAILED
        finally:
            self.metrics.breaker.labels(member.address).set(int(member.breaker.state))
        member.breaker.success()
        self.metrics.breaker.labels(member.address).set(0)
        self.metrics.latency.labels(member.address, method).observe(time.perf_counter() - start)
        return result

    def _fan_out(
        self, role: str, method: str, work: Mapping[int, Callable[[VaultClient], T]]
    ) -> dict[int, T | _Failed]:
        members = self._members[role]
        if len(work) == 1:
            ((i, fn),) = work.items()
            return {i: self._call(members[i], method, fn)}
        futures = {i: self._pool.submit(self._call, members[i], method, fn) for i, fn in work.items()}
        return {i: f.result() for i, f in futures.items()}

    def _owners(self, role: str, key: bytes) -> list[int]:
        return self._rings[role].owners(key, self.replication)

    # -- operations --------------------------------------------------------------------------------

    def put(self, namespace: bytes, items: Items, role: str = KV_COLD, *, priority: int = 0) -> int:
        """Store blobs on each key's owners; returns how many keys at least one vault acknowledged."""
        role = self._resolve(role)
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        per_vault: dict[int, list[tuple[bytes, Buffer]]] = defaultdict(list)
        for key, data in pairs:
            for v in self._owners(role, key):
                per_vault[v].append((key, data))
        results = self._fan_out(
            role,
            "put",
            {v: partial(_put, namespace=namespace, items=b, priority=priority) for v, b in per_vault.items()},
        )
        acked: set[bytes] = set()
        for v, outcome in results.items():
            if outcome is not FAILED:
                acked.update(k for k, _ in per_vault[v])
                self.metrics.bytes.labels(self._members[role][v].address, "out").inc(
                    sum(len(d) for _, d in per_vault[v])
                )
        return len(acked)

    def get_buffers(
        self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD
    ) -> list[Buffer | None]:
        """One BatchGet per vault per replica pass; None for keys no healthy owner has."""
        role = self._resolve(role)
        results: list[Buffer | None] = [None] * len(keys)
        owners = [self._owners(role, k) for k in keys]
        pending = list(range(len(keys)))
        for rank in range(self.replication):
            per_vault: dict[int, list[int]] = defaultdict(list)
            for i in pending:
                if rank < len(owners[i]):
                    per_vault[owners[i][rank]].append(i)
            if not per_vault:
                break
            got = self._fan_out(
                role,
                "get",
                {
                    v: partial(_get_buffers, namespace=namespace, keys=[keys[i] for i in idx])
                    for v, idx in per_vault.items()
                },
            )
            for v, blobs in got.items():
                if blobs is FAILED:
                    continue
                address = self._members[role][v].address
                for i, blob in zip(per_vault[v], blobs, strict=True):
                    results[i] = blob
                    if blob is not None:
                        self.metrics.bytes.labels(address, "in").inc(len(blob))
            pending = [i for i in pending if results[i] is None]
            if not pending:
                break
        hits = len(keys) - len(pending)
        self.metrics.keys.labels(role, "hit").inc(hits)
        self.metrics.keys.labels(role, "miss").inc(len(pending))
        return results

    def get(self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD) -> list[bytes | None]:
        return as_bytes(self.get_buffers(namespace, keys, role))

    def prefix_lookup(self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD) -> int:
        """Length of the leading run of ``keys`` present on some healthy owner (conservative, never over)."""
        role = self._resolve(role)
        positions: list[dict[int, int]] = []
        per_vault: dict[int, list[bytes]] = defaultdict(list)
        for key in keys:
            where = {}
            for v in self._owners(role, key):
                where[v] = len(per_vault[v])
                per_vault[v].append(key)
            positions.append(where)
        counts = self._fan_out(
            role,
            "prefix_lookup",
            {v: partial(_prefix_lookup, namespace=namespace, keys=ks) for v, ks in per_vault.items()},
        )
        for n, where in enumerate(positions):
            if not any(
                (count := counts.get(v, FAILED)) is not FAILED and pos < count for v, pos in where.items()
            ):
                return n
        return len(keys)

    def delete(self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD) -> int:
        """Delete keys from all their owners; returns how many entries were removed across vaults."""
        role = self._resolve(role)
        per_vault: dict[int, list[bytes]] = defaultdict(list)
        for key in keys:
            for v in self._owners(role, key):
                per_vault[v].append(key)
        done = self._fan_out(
            role, "delete", {v: partial(_delete, namespace=namespace, keys=ks) for v, ks in per_vault.items()}
        )
        return sum(n for n in done.values() if n is not FAILED)

    def stats(self) -> list[tuple[str, str, VaultStats | VaultError]]:
        """(role, address, stats or the error) for every vault, asked in parallel, breakers ignored."""
        jobs = []
        for role, members in self._members.items():
            for m in members:
                jobs.append((role, m.address, self._pool.submit(_stats_or_error, m.client)))
        return [(role, address, f.result()) for role, address, f in jobs]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for members in self._members.values():
            for m in members:
                m.client.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stats_or_error(client: VaultClient) -> VaultStats | VaultError:
    try:
        return client.stats()
    except VaultError as exc:
        return exc


def _put(client: VaultClient, *, namespace: bytes, items: Items, priority: int) -> int:
    return client.put(namespace, items, priority=priority)


def _get_buffers(client: VaultClient, *, namespace: bytes, keys: Sequence[bytes]) -> list[Buffer | None]:
    return client.get_buffers(namespace, keys)


def _prefix_lookup(client: VaultClient, *, namespace: bytes, keys: Sequence[bytes]) -> int:
    return client.prefix_lookup(namespace, keys)


def _delete(client: VaultClient, *, namespace: bytes, keys: Sequence[bytes]) -> int:
    return client.delete(namespace, keys)
