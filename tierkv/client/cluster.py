"""The inference side's view of all vaults: roles, sharding, replication, deadlines, breakers.

``Cluster`` is what engine hooks call. It never raises because a vault failed: a vault that is down, slow
(past its deadline) or refusing us turns its keys into misses, is counted, and after a few failures its
circuit breaker stops further calls until a probe succeeds; a vault that answers with a refusal (full,
busy) is not down, and its breaker stays closed. Every operation fans out to the vaults involved in
parallel, one RPC per vault (one BatchGet per vault per restore), each vault's share on that vault's own
threads, so that a vault that stalls delays only its own shares.

Routing: :func:`tierkv.roles.role_for` sends attention and sliding-window KV to ``kv_cold`` and SSM /
linear-attention / conv states to ``ssm_cold`` (or to ``kv_cold`` when no ``ssm_cold`` vault is
configured). Within a role, keys are sharded by rendezvous hashing; with ``replication`` r, writes go to the
key's r owners and reads take the first owner that has the key.

Deadlines: one deadline (``timeout``) covers a whole call, however many vaults and replicas it asks. A
replicated read asks each key's first owner; the next owner is asked as soon as the first one fails or
misses, or, if it has not answered after ``hedge_after_s`` (a quarter of the timeout by default), at the
same time — so a hung replica costs a hedge delay, not a timeout, and two hung replicas cost one timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from functools import partial
from typing import Any, Generic, TypeVar

from tierkv.client._rpc import BlobSink, Items, Metas, as_bytes
from tierkv.client.breaker import CircuitBreaker
from tierkv.client.member import FAILED, Failed, Member, Work
from tierkv.client.metrics import ClusterMetrics
from tierkv.client.puts import PutReport, PutTally, put_share
from tierkv.client.sharding import Rendezvous
from tierkv.client.types import PutAck, VaultStats
from tierkv.client.vault import VaultClient
from tierkv.codec.landing import Landing, LandingSink
from tierkv.config import Config, TLSConfig
from tierkv.errors import VaultError
from tierkv.records import HotChain, PutResult, Successor
from tierkv.roles import COLD_ROLE_NAMES, Role, role_for
from tierkv.wire.framing import Buffer

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
KV_COLD = Role.KV_COLD
"""Kept importable from here for older callers; the role lives in :mod:`tierkv.roles`."""
SSM_COLD = Role.SSM_COLD
DEFAULT_HOTTEST = 32
"""Chains :meth:`Cluster.hottest` returns when not told (the vault's own default)."""


class Cluster:
    """All vaults by role. ``roles`` maps ``"kv_cold"``/``"ssm_cold"`` (or :class:`~tierkv.roles.Role`
    members) to one address or a list."""

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
        hedge_after_s: float | None = None,
        client_factory: Callable[[str], VaultClient] | None = None,
        clock: Callable[[], float] = time.monotonic,
        **client_options: Any,
    ) -> None:
        """``client_factory(address)`` makes each vault's client (default: a :class:`VaultClient` with
        this cluster's timeout, token, TLS and ``client_options``; tests pass clients over a
        :class:`~tierkv.client.mock.MockTransport`); ``clock`` times the circuit breakers' backoff."""
        self.replication = max(1, replication)
        self.timeout = timeout
        self.hedge_after_s = timeout / 4 if hedge_after_s is None else hedge_after_s
        self.metrics = ClusterMetrics()
        self._members: dict[Role, list[Member]] = {}
        self._rings: dict[Role, Rendezvous] = {}
        make_client = client_factory or (
            lambda a: VaultClient(a, timeout=timeout, token=token, tls=tls, **client_options)
        )
        for role, addresses in _cold_roles(roles).items():
            self._members[role] = [
                Member(
                    a,
                    make_client(a),
                    CircuitBreaker(threshold=breaker_threshold, backoff_s=breaker_backoff_s, clock=clock),
                    self.metrics,
                )
                for a in addresses
            ]
            self._rings[role] = Rendezvous(addresses)
        if Role.KV_COLD not in self._members:
            raise ValueError("a cluster needs at least one kv_cold vault")
        self._fallback_logged = threading.Event()
        self._put_report = PutReport(self.metrics)

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

    def role_for(self, layer_group: object) -> Role:
        """The role that stores a layer group (an enum member or its name): :func:`tierkv.roles.role_for`."""
        return role_for(layer_group)

    def _resolve(self, role: str) -> Role:
        parsed = Role.parse(role)
        if parsed in self._members:
            return parsed
        if parsed is Role.SSM_COLD:
            if not self._fallback_logged.is_set():
                self._fallback_logged.set()
                log.info("no ssm_cold vault configured: SSM state goes to kv_cold")
            return Role.KV_COLD
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(COLD_ROLE_NAMES)}")

    def members(self, role: str) -> list[str]:
        return [m.address for m in self._members.get(Role.parse(role), [])]

    # -- fan-out -----------------------------------------------------------------------------------

    def _submit(
        self, role: Role, method: str, vault: int, fn: Work[T], deadline: float | None
    ) -> Future[Any]:
        return self._members[role][vault].submit(method, fn, deadline)

    def _fan_out(
        self, role: Role, method: str, work: Mapping[int, Work[T]], deadline: float | None
    ) -> dict[int, T | Failed]:
        """Every vault's share in parallel (in the caller's thread when there is one); a share still out
        at ``deadline`` is FAILED."""
        if len(work) == 1:
            ((v, fn),) = work.items()
            return {v: self._members[role][v].call(method, fn, deadline)}
        futures = {v: self._submit(role, method, v, fn, deadline) for v, fn in work.items()}
        wait(futures.values(), timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        return {v: f.result() if f.done() else FAILED for v, f in futures.items()}

    def _owners(self, role: Role, key: bytes) -> list[int]:
        return self._rings[role].owners(key, self.replication)

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout

    # -- operations --------------------------------------------------------------------------------

    def put(
        self,
        namespace: bytes,
        items: Items,
        role: str = KV_COLD,
        *,
        priority: int = 0,
        meta: Metas | None = None,
    ) -> PutResult:
        """Store blobs on each key's owners; a :class:`~tierkv.records.PutResult` of what the vaults' replies
        said (a key counts as stored once one owner's reply says so; a vault that failed or answered
        what does not add up stored nothing).

        ``meta`` maps keys to their :class:`~tierkv.retention.BlockMeta` (source class, importance, time to
        live, protected, parent key); keys it does not name are stored untagged, as before. A put's
        deadline grows with its size (see ``min_bytes_per_s`` of the clients). With replication the put
        waits for a slow replica no longer than ``hedge_after_s`` once every key is stored on an owner or
        refused by all of them, as reads do: copies still out then count as ``lagging``, and their calls
        go on within their own deadline, reading ``items`` until they end (pass bytes, or leave the
        buffers untouched). Refusals and failures are counted in the metrics and logged at most once
        per ten seconds."""
        resolved = self._resolve(role)
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        tally = PutTally([k for k, _ in pairs], [self._owners(resolved, k) for k, _ in pairs])
        work = {
            v: partial(
                put_share,
                namespace=namespace,
                items=[pairs[i] for i in positions],
                priority=priority,
                meta=meta,
            )
            for v, positions in tally.per_vault.items()
        }
        if self.replication == 1:
            for v, ack in self._fan_out(resolved, "put", work, None).items():
                tally.take(v, None if ack is FAILED else ack)
        else:
            self._put_replicated(resolved, tally, work)
        for v, nbytes in tally.bytes_out(pairs).items():
            self.metrics.bytes.labels(self._members[resolved][v].address, "out").inc(nbytes)
        result = tally.result([m.address for m in self._members[resolved]])
        self._put_report.note(resolved, result)
        return result

    def _put_replicated(self, role: Role, tally: PutTally, work: Mapping[int, Work[PutAck]]) -> None:
        """Every owner's share in parallel, taken as it answers, until all answered or ``hedge_after_s``
        after every key settled (the shares still out are left to finish on their own)."""
        pending = {self._submit(role, "put", v, fn, None): v for v, fn in work.items()}
        grace_ends: float | None = None
        while pending:
            timeout = None if grace_ends is None else max(0.0, grace_ends - time.monotonic())
            done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
            if not done:
                return
            for f in done:
                ack = f.result()
                tally.take(pending.pop(f), None if ack is FAILED else ack)
            if grace_ends is None and tally.settled():
                grace_ends = time.monotonic() + self.hedge_after_s

    def get_buffers(
        self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD, *, timeout: float | None = None
    ) -> list[Buffer | None]:
        """A blob or None per key, within one timeout (the cluster's, or ``timeout`` seconds): one BatchGet
        per vault asked; with replication, the next owner of a key is asked when the previous one failed,
        missed or is slow (see the module)."""
        resolved = self._resolve(role)
        read = _BufferRead(namespace, keys, [self._owners(resolved, k) for k in keys])
        return self._read(resolved, read, timeout)

    def get_each(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        on_blob: BlobSink,
        role: str = KV_COLD,
        *,
        timeout: float | None = None,
    ) -> list[int | None]:
        """:meth:`get_buffers` that hands each key's blob to ``on_blob(i, blob)`` once, as soon as it
        arrives from whichever vault (on that vault's thread), and keeps none: returns each blob's size
        (None: not found). ``on_blob`` never runs after this call returned, so a caller may write blobs
        straight into memory it owns only until then; a blob is valid only during its call."""
        resolved = self._resolve(role)
        owners = [self._owners(resolved, k) for k in keys]
        read = _EachRead(namespace, keys, owners, on_blob)
        return self._read(resolved, read, timeout)

    def _read(self, resolved: Role, read: _Read[R], timeout: float | None) -> list[R | None]:
        deadline = self._deadline() if timeout is None else time.monotonic() + timeout
        try:
            if self.replication == 1 or len(self._members[resolved]) == 1:
                wave = read.wave(range(len(read.keys)))
                work = {v: read.work(v, idx) for v, idx in wave.items()}
                got = self._fan_out(resolved, "get", work, deadline)
                read.take([(v, wave[v], answer) for v, answer in got.items()])
            else:
                self._hedged(resolved, read, deadline)
        finally:
            read.close()
        found = sum(r is not None for r in read.results)
        for v, n in read.bytes_in.items():
            self.metrics.bytes.labels(self._members[resolved][v].address, "in").inc(n)
        self.metrics.keys.labels(resolved, "hit").inc(found)
        self.metrics.keys.labels(resolved, "miss").inc(len(read.keys) - found)
        return read.results

    def _hedged(self, role: Role, read: _Read[R], deadline: float) -> None:
        """Ask owners rank after rank until every key is found, no owner is left or time is up: a key's
        next owner is asked once the previous one failed or missed it, and at every hedge tick for each
        key still open (its earlier owners may be hung)."""
        out: dict[Future[Any], tuple[int, list[int]]] = {}
        wave = read.wave(range(len(read.keys)))
        tick = time.monotonic() + self.hedge_after_s
        while True:
            for v, idx in wave.items():
                out[self._submit(role, "get", v, read.work(v, idx), deadline)] = (v, idx)
            now = time.monotonic()
            if not out or not read.open() or now >= deadline:
                return
            done, _ = wait(out, timeout=min(tick, deadline) - now, return_when=FIRST_COMPLETED)
            missed = read.take([(*out.pop(f), f.result()) for f in done])
            if time.monotonic() < tick:
                wave = read.wave(missed)
                continue
            tick += self.hedge_after_s
            wave = read.wave(read.open())
            self.metrics.hedges.labels(role).inc(sum(len(idx) for idx in wave.values()))

    def get(self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD) -> list[bytes | None]:
        return as_bytes(self.get_buffers(namespace, keys, role))

    def prefix_lookup(
        self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD, *, lease_ms: int = 0
    ) -> int:
        """Length of the leading run of ``keys`` present on some healthy owner (conservative, never over);
        ``lease_ms`` leases them on every owner that reports them."""
        resolved = self._resolve(role)
        positions: list[dict[int, int]] = []
        per_vault: dict[int, list[bytes]] = defaultdict(list)
        for key in keys:
            where = {}
            for v in self._owners(resolved, key):
                where[v] = len(per_vault[v])
                per_vault[v].append(key)
            positions.append(where)
        counts = self._fan_out(
            resolved,
            "prefix_lookup",
            {
                v: partial(_prefix_lookup, namespace=namespace, keys=ks, lease_ms=lease_ms)
                for v, ks in per_vault.items()
            },
            self._deadline(),
        )
        for n, where in enumerate(positions):
            if not any(
                (count := counts.get(v, FAILED)) is not FAILED and pos < count for v, pos in where.items()
            ):
                return n
        return len(keys)

    def delete(self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD) -> int:
        """Delete keys from all their owners; returns how many entries were removed across vaults."""
        resolved = self._resolve(role)
        per_vault: dict[int, list[bytes]] = defaultdict(list)
        for key in keys:
            for v in self._owners(resolved, key):
                per_vault[v].append(key)
        done = self._fan_out(
            resolved,
            "delete",
            {v: partial(_delete, namespace=namespace, keys=ks) for v, ks in per_vault.items()},
            self._deadline(),
        )
        return sum(n for n in done.values() if n is not FAILED)

    def hottest(
        self, namespace: bytes, *, limit: int = 0, tenant: str = "", role: str = KV_COLD
    ) -> list[HotChain]:
        """The namespace's most-hit chains on every vault of ``role``, merged hottest first (a replicated
        chain once); at most ``limit`` (0: 32). A failed vault adds nothing. Each vault walks only the
        blocks it holds: with keys sharded over several vaults a chain is cut where its blocks change
        vault, and such a piece comes without token ids."""
        resolved = self._resolve(role)
        work = {
            v: partial(_hottest, namespace=namespace, limit=limit, tenant=tenant)
            for v in range(len(self._members[resolved]))
        }
        done = self._fan_out(resolved, "hottest", work, self._deadline())
        merged: dict[tuple[bytes, ...], HotChain] = {}
        for chains in done.values():
            for c in [] if chains is FAILED else chains:
                if c.keys not in merged or c.hits > merged[c.keys].hits:
                    merged[c.keys] = c
        ordered = sorted(merged.values(), key=lambda c: c.hits, reverse=True)
        return ordered[: limit or DEFAULT_HOTTEST]

    def successors(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        role: str = KV_COLD,
        *,
        max_bytes: int = 0,
        max_keys: int = 0,
        timeout: float | None = None,
    ) -> list[Successor]:
        """The blocks the role's vaults expect to be fetched after the chain ``keys``, best first, merged
        over every vault (each knows the blocks it stores) within ``max_bytes`` and ``max_keys`` (0: the
        vaults' defaults); a vault that fails or is slow adds nothing. Within ``timeout`` seconds (default:
        the cluster's)."""
        if not keys:
            return []
        resolved = self._resolve(role)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        work = partial(_successors, namespace=namespace, keys=keys, max_bytes=max_bytes, max_keys=max_keys)
        answers = self._fan_out(
            resolved, "successors", dict.fromkeys(range(len(self._members[resolved])), work), deadline
        )
        return merge_successors(
            [a for a in answers.values() if a is not FAILED], max_bytes=max_bytes, max_keys=max_keys
        )

    def stats(self) -> list[tuple[str, str, VaultStats | VaultError]]:
        """(role, address, stats or the error) for every vault, asked in parallel, breakers ignored."""
        jobs = []
        for role, members in self._members.items():
            for m in members:
                jobs.append((str(role), m.address, m.pool.submit(_stats_or_error, m.client)))
        return [(role, address, f.result()) for role, address, f in jobs]

    def close(self) -> None:
        for members in self._members.values():
            for m in members:
                m.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Read(ABC, Generic[R]):
    """One replicated read in progress: the results so far and how many owners of each key were asked.

    ``R`` is what a found key yields: its blob (:meth:`Cluster.get_buffers`) or its size
    (:meth:`Cluster.get_each`, whose vault threads record each blob's size as it arrives, the first
    copy of a key winning, and hand the blob to the caller's sink). :meth:`close` waits for hand-overs in
    progress and turns away later arrivals (a share still running past the deadline), so the sink never
    runs after the read returned.
    """

    def __init__(self, namespace: bytes, keys: Sequence[bytes], owners: list[list[int]]) -> None:
        self.namespace = namespace
        self.keys = keys
        self.owners = owners
        self.results: list[R | None] = [None] * len(keys)
        self.asked = [0] * len(keys)
        self.bytes_in: dict[int, int] = defaultdict(int)
        self._cond = threading.Condition()
        self._handing = 0
        self._closed = False

    def wave(self, indices: Iterable[int]) -> dict[int, list[int]]:
        """The next owner of each open key in ``indices`` that has one left, as vault → key indices."""
        per_vault: dict[int, list[int]] = defaultdict(list)
        for i in indices:
            if self.results[i] is None and self.asked[i] < len(self.owners[i]):
                per_vault[self.owners[i][self.asked[i]]].append(i)
                self.asked[i] += 1
        return per_vault

    @abstractmethod
    def work(self, vault: int, indices: Sequence[int]) -> Work[list[R | None]]:
        """One vault's share: the keys at ``indices``, asked of ``vault``."""

    @abstractmethod
    def size(self, item: R) -> int:
        """Bytes a found key's result stands for."""

    def take(self, answers: Iterable[tuple[int, list[int], list[R | None] | Failed]]) -> list[int]:
        """Record (vault, key indices, its answer) triples; returns the keys they did not deliver."""
        missed: list[int] = []
        with self._cond:
            for v, indices, found in answers:
                if found is FAILED:
                    missed.extend(i for i in indices if self.results[i] is None)
                    continue
                for i, item in zip(indices, found, strict=True):
                    if item is None:
                        missed.append(i)
                    elif self.results[i] is None and not self._closed:
                        self.results[i] = item
                        self.bytes_in[v] += self.size(item)
        return missed

    def close(self) -> None:
        """No more hand-overs: wait for those in progress, refuse the rest."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._handing == 0)

    def open(self) -> list[int]:
        return [i for i, r in enumerate(self.results) if r is None]


class _BufferRead(_Read[Buffer]):
    """A read that keeps the blobs."""

    def work(self, vault: int, indices: Sequence[int]) -> Work[list[Buffer | None]]:
        return partial(_get_buffers, namespace=self.namespace, keys=[self.keys[i] for i in indices])

    def size(self, item: Buffer) -> int:
        return len(item)


class _EachRead(_Read[int]):
    """A read of sizes whose blobs stream to the caller's ``on_blob`` as they arrive.

    When ``on_blob`` is a :class:`~tierkv.codec.landing.LandingSink`, a key with one owner is received
    straight into the memory it offers: one vault can write there, so no two copies race into it. A
    landing counts as a hand-over from its offer to its end, so :meth:`close` waits for it too.
    """

    def __init__(
        self, namespace: bytes, keys: Sequence[bytes], owners: list[list[int]], on_blob: BlobSink
    ) -> None:
        super().__init__(namespace, keys, owners)
        self.on_blob = on_blob
        self._lands = on_blob if isinstance(on_blob, LandingSink) else None

    def work(self, vault: int, indices: Sequence[int]) -> Work[list[int | None]]:
        keys = [self.keys[i] for i in indices]
        return partial(_get_each, namespace=self.namespace, keys=keys, on_blob=_Share(self, vault, indices))

    def size(self, item: int) -> int:
        return item

    def arrived(self, vault: int, i: int, blob: Buffer) -> None:
        """A vault thread's blob for key ``i``: its size recorded and the blob handed to ``on_blob``,
        unless another copy came first or the read is over."""
        with self._cond:
            if not self._record(vault, i, len(blob)):
                return
            self._handing += 1
        try:
            self.on_blob(i, blob)
        finally:
            self.hand_over_ended()

    def _record(self, vault: int, i: int, size: int) -> bool:
        """Under the lock: key ``i`` found at ``vault`` with ``size`` bytes, unless another copy came first
        or the read is over (then False)."""
        if self._closed or self.results[i] is not None:
            return False
        self.results[i] = size
        self.bytes_in[vault] += size
        return True

    def landed(self, vault: int, i: int, size: int) -> bool:
        """A landing of key ``i`` ended with every byte in: whether it counts (the read is still open and
        no other copy came first)."""
        with self._cond:
            return self._record(vault, i, size)

    def land(self, vault: int, i: int, size: int) -> Landing | None:
        """The caller's landing for key ``i``, when it offers one and no other vault may send the key."""
        if self._lands is None or len(self.owners[i]) != 1:
            return None
        with self._cond:
            if self._closed or self.results[i] is not None:
                return None
            landing = self._lands.land(i, size)
            if landing is None:
                return None
            self._handing += 1
        return _Counted(self, vault, i, landing)

    def hand_over_ended(self) -> None:
        """A hand-over (a blob handed to ``on_blob``, or a landing) is over: :meth:`close` may go on."""
        with self._cond:
            self._handing -= 1
            self._cond.notify_all()


class _Share:
    """One vault's sink in an :class:`_EachRead`: its key positions mapped to the read's."""

    def __init__(self, read: _EachRead, vault: int, indices: Sequence[int]) -> None:
        self.read, self.vault, self.indices = read, vault, indices

    def __call__(self, j: int, blob: Buffer) -> None:
        self.read.arrived(self.vault, self.indices[j], blob)

    def land(self, j: int, size: int) -> Landing | None:
        return self.read.land(self.vault, self.indices[j], size)


class _Counted:
    """A landing that records the key's size when it lands and ends its hand-over either way."""

    def __init__(self, read: _EachRead, vault: int, i: int, inner: Landing) -> None:
        self.read, self.vault, self.i, self.inner = read, vault, i, inner

    @property
    def buffers(self) -> Sequence[memoryview]:
        return self.inner.buffers

    def landed(self) -> None:
        try:
            if self.read.landed(self.vault, self.i, sum(len(b) for b in self.inner.buffers)):
                self.inner.landed()
            else:
                self.inner.abandon()
        finally:
            self.read.hand_over_ended()

    def abandon(self) -> None:
        try:
            self.inner.abandon()
        finally:
            self.read.hand_over_ended()


def _cold_roles(roles: Mapping[str, Sequence[str] | str]) -> dict[Role, list[str]]:
    """Addresses by cold role; ValueError naming an unknown or non-vault role."""
    out: dict[Role, list[str]] = {}
    for name, addresses in roles.items():
        try:
            role = Role.parse(name)
        except ValueError:
            role = Role.INFERENCE
        if not role.cold:
            raise ValueError(f"unknown roles [{name!r}]; expected {', '.join(COLD_ROLE_NAMES)}")
        addrs = [addresses] if isinstance(addresses, str) else list(addresses)
        if addrs:
            out[role] = addrs
    return out


def _stats_or_error(client: VaultClient) -> VaultStats | VaultError:
    try:
        return client.stats()
    except VaultError as exc:
        return exc


def _get_buffers(
    client: VaultClient, timeout: float | None, *, namespace: bytes, keys: Sequence[bytes]
) -> list[Buffer | None]:
    return client.get_buffers(namespace, keys, timeout=timeout)


def _get_each(
    client: VaultClient, timeout: float | None, *, namespace: bytes, keys: Sequence[bytes], on_blob: BlobSink
) -> list[int | None]:
    return client.get_each(namespace, keys, on_blob, timeout=timeout)


def _successors(
    client: VaultClient,
    timeout: float | None,
    *,
    namespace: bytes,
    keys: Sequence[bytes],
    max_bytes: int,
    max_keys: int,
) -> list[Successor]:
    return client.successors(namespace, keys, max_bytes=max_bytes, max_keys=max_keys, timeout=timeout)


def merge_successors(
    answers: Iterable[Sequence[Successor]], *, max_bytes: int, max_keys: int
) -> list[Successor]:
    """Several vaults' suggestions as one: best score first, each key once, within the bounds (0: none)."""
    out: list[Successor] = []
    seen: set[bytes] = set()
    total = 0
    for s in sorted((s for a in answers for s in a), key=lambda s: -s.score):
        if s.key in seen:
            continue
        if (max_keys and len(out) >= max_keys) or (max_bytes and total + s.size > max_bytes):
            break
        seen.add(s.key)
        out.append(s)
        total += s.size
    return out


def _prefix_lookup(
    client: VaultClient, timeout: float | None, *, namespace: bytes, keys: Sequence[bytes], lease_ms: int
) -> int:
    return client.prefix_lookup(namespace, keys, timeout=timeout, lease_ms=lease_ms)


def _hottest(
    client: VaultClient, timeout: float | None, *, namespace: bytes, limit: int, tenant: str
) -> list[HotChain]:
    return client.hottest(namespace, limit=limit, tenant=tenant, timeout=timeout)


def _delete(client: VaultClient, timeout: float | None, *, namespace: bytes, keys: Sequence[bytes]) -> int:
    return client.delete(namespace, keys, timeout=timeout)
