"""Replay a trace through real vaults, once per eviction policy and capacity, and count what hits.

Per request, as an engine hook with tierkv does it (the vLLM connector's order): the chained block keys of
the prompt's full blocks (fixed block size, the tenant's namespace; a hash-id trace's ids hashed into it),
``prefix_lookup`` with a lease of the blocks before the prompt's last token (an engine always computes at
least that token, so a prompt seen whole before hits every full block but the last), a read of the blocks
it found (so the vault records the hits; a block gone between lookup and read ends the hit there, as the
engine then recomputes), then a put of every full block from the first miss on (the engine just computed
them). A prompt shorter than one block has no block to look up or store. Each policy gets what it can
use: ``lru`` nothing, ``priority-lru`` an integer priority (importance × 100, what an application can
send today), ``context`` and ``adaptive`` the blocks' :class:`~tierkv.retention.BlockMeta` from the
layout (:func:`~tierkv.retention.tag_blocks` + :func:`~tierkv.retention.with_parents`).

Every (capacity, policy) pair gets a fresh vault on loopback whose budget is that fraction of the trace's
working set (its distinct blocks, charged as the vault charges them: blob + namespace + key). Blobs are
synthetic: one random buffer of the model's KV bytes per block with the key written over its first bytes,
so every stored blob is distinct and nothing is spent generating data. All blobs have one size, so the
hit rates depend on the capacity fraction only, and ``--blob-bytes`` can shrink a quick run. Requests with
a ``timestamp`` are replayed at ``speedup`` times their pace when it is set (a trace of an hour at 60×
takes a minute, and times to live and leases see the time pass), else back to back.

Hits are also counted against the *ceiling*: the blocks an unbounded vault would have (those seen earlier
in the trace; with chained keys they always form a prefix). A first-seen block can never hit, whatever the
policy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from tierkv.bench.common import Deadline
from tierkv.bench.trace.model import Request, Trace
from tierkv.client.cluster import Cluster
from tierkv.client.types import VaultStats
from tierkv.errors import BenchError, VaultError
from tierkv.keys import Namespace, block_keys
from tierkv.retention import UNTAGGED, BlockMeta, tag_blocks, with_parents
from tierkv.roles import Role
from tierkv.vault.launcher import VaultProcess

log = logging.getLogger(__name__)

POLICIES: Final = ("lru", "adaptive", "priority-lru", "context")
TAGGED: Final = frozenset({"context", "adaptive"})
"""Policies that get the blocks' metadata with each put."""
LEASE_MS: Final = 2000
"""The lookup lease the replay asks for (the vLLM connector's default ``lookup_lease_ms``)."""
MIN_VAULT_BYTES: Final = 1 << 20
"""The smallest budget a vault accepts (``[vault] max_bytes``)."""
IMPORTANT: Final = 0.7
"""Blocks of at least this importance are the ones the context policy must keep better than LRU."""
ALL, IMPORTANT_GROUP, PROTECTED = "all", "importance>=0.7", "protected"
UNTAGGED_CLASS = "untagged"
_UNTAGGED_GROUPS: Final = (ALL, UNTAGGED_CLASS)
KV_COLD = Role.KV_COLD.value
_HASH_ID_TAG: Final = b"tierkv/trace-hash-id/v1\x00"
_ID_MASK: Final = (1 << 64) - 1
"""A signed 64-bit id as its unsigned bits (ids 0..2**63-1 keep their bytes)."""


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    policies: tuple[str, ...] = POLICIES
    capacities: tuple[float, ...] = (0.1, 0.3, 0.6)
    block_tokens: int = 16
    blob_bytes: int = 16 * 12288
    prefill_tps: float = 5000.0
    sync: str = "fast"
    state_dir: Path | None = None
    max_seconds: float = 1800.0
    batch_bytes: int = 16 << 20
    model: str = "qwen2.5-0.5b"
    protected_cap: float = 0.5
    """The vault's ``[retention] max_protected_fraction`` (context policy) and what targets judge by."""
    min_turnover: int = 0
    """The context vaults' ``[retention.weights] min_turnover`` (0: the default, off)."""
    speedup: float = 0.0
    """Replay timestamps at this many times their pace (0: back to back)."""
    lease_ms: int = LEASE_MS
    """The lookups' lease (a lookup reports only blocks it could lease: at most a quarter of the budget)."""

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown or not self.policies:
            raise BenchError(f"--policies: expected some of {', '.join(POLICIES)}, got {list(self.policies)}")
        if not self.capacities or not all(0.0 < c <= 1.0 for c in self.capacities):
            raise BenchError(f"--capacities: fractions in (0, 1], got {list(self.capacities)}")
        checks: dict[str, float] = {"--block-tokens": self.block_tokens, "--blob-bytes": self.blob_bytes - 32}
        checks |= {"--prefill-tokens-per-s": self.prefill_tps, "--max-seconds": self.max_seconds}
        bad = [name for name, value in checks.items() if not value > 0]
        if bad:
            raise BenchError(f"{', '.join(bad)} must be positive (--blob-bytes more than 32)")
        if not 0.0 < self.protected_cap <= 1.0:
            raise BenchError(f"--protected-cap must be a fraction in (0, 1], got {self.protected_cap}")
        if self.min_turnover < 0:
            raise BenchError(f"--min-turnover must be >= 0, got {self.min_turnover}")
        if not 0 <= self.lease_ms <= 10_000:
            raise BenchError(f"--lease-ms must be in 0..10000, got {self.lease_ms}")
        if not 0.0 <= self.speedup < float("inf"):
            raise BenchError(f"--speedup must be >= 0 (0: back to back), got {self.speedup}")
        if self.sync not in ("durable", "fast"):
            raise BenchError("--vault-sync must be durable or fast")


@dataclasses.dataclass(frozen=True)
class Prepared:
    """One request as blocks: keys and the layout's metadata of each (``tags``, parents set; None for a
    request without a layout, whose blocks are all untagged); ``lookable`` is how many leading blocks may
    hit (those before the last token), ``ceiling`` how many an unbounded vault would hit."""

    namespace: bytes
    keys: list[bytes]
    tags: list[BlockMeta] | None
    lookable: int
    ceiling: int
    n_tokens: int = 0
    timestamp: float | None = None

    @property
    def tagged(self) -> bool:
        return self.tags is not None and any(m.source for m in self.tags)

    @property
    def metas(self) -> list[BlockMeta]:
        """Every block's metadata with its parent; an untagged request's is built when asked for (a
        hash-id trace of millions of blocks would otherwise hold an object per block it never sends)."""
        if self.tags is not None:
            return self.tags
        return with_parents([UNTAGGED] * len(self.keys), self.keys)

    def groups(self, i: int) -> tuple[str, ...]:
        """The tallies block ``i`` counts in: overall, its class, and the important / protected sets."""
        if self.tags is None:
            return _UNTAGGED_GROUPS
        meta = self.tags[i]
        found = [ALL, meta.source or UNTAGGED_CLASS]
        if meta.importance >= IMPORTANT:
            found.append(IMPORTANT_GROUP)
        if meta.protected:
            found.append(PROTECTED)
        return tuple(found)


@dataclasses.dataclass
class Tally:
    """Block lookups of one group: how many, how many hit, how many could have (the ceiling), and how
    many were then put (every block from a request's first miss on)."""

    blocks: int = 0
    hits: int = 0
    possible: int = 0
    stored: int = 0

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.blocks if self.blocks else None

    @property
    def ceiling_rate(self) -> float | None:
        return self.possible / self.blocks if self.blocks else None

    @property
    def of_possible(self) -> float | None:
        """Hits over what an unbounded vault would have hit (1.0: the policy lost nothing)."""
        return self.hits / self.possible if self.possible else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "hits": self.hits,
            "possible": self.possible,
            "stored": self.stored,
            "hit_rate": self.hit_rate,
            "ceiling_rate": self.ceiling_rate,
            "of_possible": self.of_possible,
        }


@dataclasses.dataclass
class Workload:
    """The trace as block streams, with its working set: what every policy run replays."""

    requests: list[Prepared]
    block_tokens: int
    charge: int
    distinct: int
    protected_distinct: int
    prompt_tokens: int

    @property
    def working_set_bytes(self) -> int:
        return self.distinct * self.charge

    @property
    def protected_bytes(self) -> int:
        return self.protected_distinct * self.charge

    def ceiling(self) -> dict[str, Tally]:
        """The tallies of an unbounded vault (every seen block hits)."""
        return count(self.requests, [r.ceiling for r in self.requests])


def tenant_namespace(tenant: str, model: str, block_tokens: int) -> Namespace:
    return Namespace(
        model=f"tierkv-bench-trace/{model}",
        dtype="bfloat16",
        codec="raw",
        tenant=tenant,
        layout=f"trace-v1/{block_tokens}",
    )


def hash_keys(
    ids: Sequence[int],
    n_tokens: int,
    block_tokens: int,
    namespace: Namespace,
    memo: dict[int, bytes] | None = None,
) -> list[bytes]:
    """Keys of a hash-id request's full blocks: its ids are chained already, so a key is the id hashed
    into the tenant's namespace (a trailing partial block gets none, as with token ids). ``memo`` (one
    per namespace) hands back the key computed for an id before: a trace resends its prefixes, so most
    ids come again, and one key object each keeps a large trace's memory to its distinct blocks."""
    full = min(len(ids), n_tokens // block_tokens)
    head = _HASH_ID_TAG + namespace.root_key
    memo = {} if memo is None else memo
    out = []
    for i in ids[:full]:
        key = memo.get(i)
        if key is None:
            key = memo[i] = hashlib.sha256(head + (i & _ID_MASK).to_bytes(8, "big")).digest()
        out.append(key)
    return out


def request_keys(
    request: Request, block_tokens: int, namespace: Namespace, memo: dict[int, bytes] | None = None
) -> list[bytes]:
    if request.hash_ids is not None:
        return hash_keys(request.hash_ids, request.n_tokens, block_tokens, namespace, memo)
    return block_keys(request.token_ids(), block_tokens, namespace=namespace)


def prepare(trace: Trace, settings: ReplaySettings) -> Workload:
    """Keys, metadata and ceiling of every request (computed once, replayed once per run)."""
    seen: set[bytes] = set()
    protected: set[bytes] = set()
    spaces: dict[str, tuple[Namespace, dict[int, bytes]]] = {}
    out: list[Prepared] = []
    bt = settings.block_tokens
    for request in trace.requests:
        ns, memo = spaces.get(request.tenant) or spaces.setdefault(
            request.tenant, (tenant_namespace(request.tenant, settings.model, bt), {})
        )
        keys = request_keys(request, bt, ns, memo)
        tags = with_parents(tag_blocks(request.chunks(), len(keys), bt), keys) if request.layout else None
        lookable = min(len(keys), max(0, request.n_tokens - 1) // bt)
        ceiling = next((i for i, k in enumerate(keys[:lookable]) if k not in seen), lookable)
        seen.update(keys)
        if tags is not None:
            protected.update(k for k, m in zip(keys, tags, strict=True) if m.protected)
        out.append(Prepared(ns.digest, keys, tags, lookable, ceiling, request.n_tokens, request.timestamp))
    charge = settings.blob_bytes + 32 + 32  # namespace digest + key, as the vault charges an entry
    tokens = sum(r.n_tokens for r in trace.requests)
    return Workload(out, bt, charge, len(seen), len(protected), tokens)


def count(requests: Sequence[Prepared], hits: Sequence[int]) -> dict[str, Tally]:
    """Tallies per group of ``requests`` given how many leading blocks of each hit."""
    tallies: dict[str, Tally] = {}
    for request, hit in zip(requests, hits, strict=True):
        if request.tags is None:  # every block in the same groups: counted at once
            n = len(request.keys)
            for group in _UNTAGGED_GROUPS:
                t = tallies.setdefault(group, Tally())
                t.blocks, t.hits, t.stored = t.blocks + n, t.hits + hit, t.stored + n - hit
                t.possible += request.ceiling
            continue
        for i in range(len(request.keys)):
            for group in request.groups(i):
                t = tallies.setdefault(group, Tally())
                t.blocks += 1
                t.hits += i < hit
                t.possible += i < request.ceiling
                t.stored += i >= hit
    return tallies


@dataclasses.dataclass
class PolicyRun:
    """One replay: a policy at one capacity, its hits per group and the vault's own counters."""

    policy: str
    fraction: float
    capacity_bytes: int
    tallies: dict[str, Tally]
    prompt_tokens: int
    hit_tokens: int
    bytes_written: int
    evictions: int
    evicted_bytes: int
    stored_keys: int
    unacked: int
    seconds: float
    prefill_s_saved: float
    blob_bytes: int = 0
    resident: dict[str, int] = dataclasses.field(default_factory=dict)
    """Bytes per source class the vault still holds at the end (known to it with the context policy)."""
    expired: int = 0
    protected_overflow: int = 0
    lost: int = 0
    """Blocks a lookup found that the read after it did not return."""
    vault_hits: int = 0
    """Reads the vault counted as hits (every block the replay read)."""
    in_process: bool = False
    """Replayed by the policy's in-process twin, not a vault."""

    @property
    def token_hit_rate(self) -> float | None:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    def tally(self, group: str) -> Tally:
        return self.tallies.get(group, Tally())

    def kept(self, group: str) -> int | None:
        """Blob bytes of a source class the vault holds at the end; None where it cannot know (no metadata
        was sent, or ``group`` is not a class)."""
        if not self.resident or group in (ALL, IMPORTANT_GROUP, PROTECTED):
            return None
        return self.resident.get(group, 0)

    def as_dict(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "tallies"}
        doc["token_hit_rate"] = self.token_hit_rate
        doc["groups"] = {
            name: {
                **t.as_dict(),
                "written_bytes": t.stored * self.blob_bytes,
                "resident_bytes": self.kept(name),
            }
            for name, t in sorted(self.tallies.items())
        }
        return doc


@contextlib.contextmanager
def policy_vault(
    base: Path, policy: str, capacity: int, sync: str, protected_cap: float = 0.5, min_turnover: int = 0
) -> Iterator[Cluster]:
    """A fresh vault with ``policy`` (set through ``[vault] policy`` of its own tierkv.toml, with
    ``[retention] max_protected_fraction`` for ``context``) and budget ``capacity``; stopped by PID and
    its LMDB removed on the way out."""
    name = f"{policy}-{capacity}"
    config = base / f"{name}.toml"
    text = f'[vault]\npolicy = "{policy}"\n'
    if policy == "context":
        text += f"[retention]\nmax_protected_fraction = {protected_cap!r}\n"
        text += f"[retention.weights]\nmin_turnover = {min_turnover}\n"
    config.write_text(text)
    proc = VaultProcess(base / name, max_bytes=capacity, sync=sync, extra_args=["--config", str(config)])
    try:
        proc.start(timeout=60.0)
    except (RuntimeError, TimeoutError) as exc:
        proc.stop()
        raise BenchError(f"could not start a vault with policy {policy!r}: {_last_line(str(exc))}") from exc
    try:
        with Cluster({KV_COLD: [proc.address]}, timeout=120.0) as cluster:
            yield cluster
    finally:
        code = proc.stop()
        if code != 0:
            log.warning("%s vault exited with %d:\n%s", policy, code, proc.log_tail())
        shutil.rmtree(base / name, ignore_errors=True)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


class Blobs:
    """Synthetic blobs of one size: a random buffer with the key written over its start."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.tail = np.random.default_rng(seed).bytes(size - 32)

    def __call__(self, key: bytes) -> bytes:
        return key + self.tail


def _batches(keys: Sequence[bytes], per_batch: int) -> Iterator[Sequence[bytes]]:
    for at in range(0, len(keys), per_batch):
        yield keys[at : at + per_batch]


class Replayer:
    """Replays requests as an engine does: lookup with lease, read the hits, store the rest the way
    ``policy`` wants it (plain, by priority, or with metadata)."""

    def __init__(
        self, cluster: Cluster, policy: str, blobs: Blobs, per_batch: int, lease_ms: int = LEASE_MS
    ) -> None:
        self.cluster, self.policy, self.blobs, self.per_batch = cluster, policy, blobs, per_batch
        self.lease_ms = lease_ms
        self.unacked = 0
        """Blocks no vault acknowledged (a failed put is a miss later, and must not pass unnoticed)."""
        self.lost = 0
        """Blocks the lookup found that the read did not return."""

    def request(self, r: Prepared) -> int:
        """Look the request up, read what hit, store the rest; returns the number of leading blocks read."""
        found = (
            self.cluster.prefix_lookup(r.namespace, r.keys[: r.lookable], lease_ms=self.lease_ms)
            if r.keys
            else 0
        )
        hit = self._read(r, found)
        if self.policy == "priority-lru":
            by_priority: dict[int, list[int]] = {}
            metas = r.metas
            for i in range(hit, len(r.keys)):
                by_priority.setdefault(round(metas[i].importance * 100), []).append(i)
            for priority, idx in by_priority.items():
                self._store(r, idx, priority=priority)
        else:
            self._store(r, range(hit, len(r.keys)))
        return hit

    def _read(self, r: Prepared, found: int) -> int:
        """Read the ``found`` leading blocks; the hit ends at the first one not returned."""
        if not found:
            return 0
        blobs = self.cluster.get(r.namespace, r.keys[:found])
        hit = next((i for i, b in enumerate(blobs) if b is None), found)
        self.lost += found - hit
        return hit

    def _store(self, r: Prepared, idx: Sequence[int], *, priority: int = 0) -> None:
        keys = [r.keys[i] for i in idx]
        all_metas = r.metas if self.policy in TAGGED else None
        meta = None if all_metas is None else {r.keys[i]: all_metas[i] for i in idx}
        for batch in _batches(keys, self.per_batch):
            items = {k: self.blobs(k) for k in batch}
            metas = None if meta is None else {k: meta[k] for k in batch}
            self.unacked += (
                len(items) - self.cluster.put(r.namespace, items, priority=priority, meta=metas).stored
            )


class Pacer:
    """Waits until a request's turn when timestamps are replayed at ``speedup`` times their pace."""

    def __init__(self, speedup: float) -> None:
        self.speedup = speedup
        self.origin: tuple[float, float] | None = None

    def wait(self, timestamp: float | None) -> None:
        if not self.speedup or timestamp is None:
            return
        now = time.monotonic()
        if self.origin is None:
            self.origin = (now, timestamp)
            return
        due = self.origin[0] + (timestamp - self.origin[1]) / 1000 / self.speedup
        if due > now:
            time.sleep(due - now)


def _vault_stats(cluster: Cluster) -> VaultStats:
    for _, address, st in cluster.stats():
        if isinstance(st, VaultError):
            raise BenchError(f"vault {address} did not answer Stats: {st}")
        return st
    raise BenchError("no vault to ask for Stats")


def resident_by_class(st: VaultStats, blob_bytes: int) -> dict[str, int]:
    """Blob bytes the vault still holds per source class (it knows them when metadata came with the
    blocks); counted as entries × blob size, like the bytes written."""
    found: dict[str, int] = {}
    for c in st.classes:
        name = c.source or UNTAGGED_CLASS
        found[name] = found.get(name, 0) + c.keys * blob_bytes
    return found


def replay_one(
    work: Workload,
    settings: ReplaySettings,
    policy: str,
    fraction: float,
    base: Path,
    advance: Callable[[], object],
    deadline: Deadline,
) -> PolicyRun | None:
    """One policy at one capacity; None when the time budget ran out before the trace ended."""
    capacity = int(work.working_set_bytes * fraction)
    per_batch = max(1, settings.batch_bytes // settings.blob_bytes)
    t0 = time.perf_counter()
    hits: list[int] = []
    with policy_vault(
        base, policy, capacity, settings.sync, settings.protected_cap, settings.min_turnover
    ) as cluster:
        replayer = Replayer(cluster, policy, Blobs(settings.blob_bytes), per_batch, settings.lease_ms)
        pacer = Pacer(settings.speedup)
        for r in work.requests:
            if deadline.passed():
                return None
            pacer.wait(r.timestamp)
            hits.append(replayer.request(r))
            advance()
        st = _vault_stats(cluster)
    hit_tokens = sum(hits) * work.block_tokens
    return PolicyRun(
        policy=policy,
        fraction=fraction,
        capacity_bytes=capacity,
        tallies=count(work.requests, hits),
        prompt_tokens=work.prompt_tokens,
        hit_tokens=hit_tokens,
        bytes_written=st.bytes_in,
        evictions=st.evictions,
        evicted_bytes=st.evictions * work.charge,
        stored_keys=st.keys,
        unacked=replayer.unacked,
        seconds=time.perf_counter() - t0,
        prefill_s_saved=hit_tokens / settings.prefill_tps,
        blob_bytes=settings.blob_bytes,
        resident=resident_by_class(st, settings.blob_bytes) if policy in TAGGED else {},
        expired=st.expired,
        protected_overflow=st.protected_overflow,
        lost=replayer.lost,
        vault_hits=st.hits,
    )


def check_capacities(work: Workload, settings: ReplaySettings) -> None:
    """Every budget must be one a vault accepts (1 MiB or more) and hold at least a few blocks."""
    floor = max(MIN_VAULT_BYTES, 4 * work.charge)
    small = [c for c in settings.capacities if work.working_set_bytes * c < floor]
    if small:
        raise BenchError(
            f"capacity {', '.join(f'{c * 100:.6g}%' for c in small)} of the {work.working_set_bytes:,}-byte "
            f"working set is under {floor:,} bytes (the smallest vault budget, and room for 4 blocks): use "
            "a larger trace, other blobs (--blob-bytes) or larger --capacities"
        )


@contextlib.contextmanager
def state_base(settings: ReplaySettings) -> Iterator[Path]:
    """Where the run's vaults keep their LMDB: --state-dir, else a temporary directory."""
    if settings.state_dir is not None:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        yield settings.state_dir
        return
    with tempfile.TemporaryDirectory(prefix="tierkv-bench-trace-") as tmp:
        yield Path(tmp)


def runs_of(settings: ReplaySettings) -> list[tuple[float, str]]:
    """Capacity-major, so a run cut short by its time budget still compares policies at equal capacity."""
    return [(c, p) for c in settings.capacities for p in settings.policies]


def as_mapping(runs: Sequence[PolicyRun]) -> Mapping[tuple[str, float], PolicyRun]:
    return {(r.policy, r.fraction): r for r in runs}


__all__ = [
    "ALL",
    "IMPORTANT",
    "IMPORTANT_GROUP",
    "POLICIES",
    "PROTECTED",
    "TAGGED",
    "Blobs",
    "Pacer",
    "PolicyRun",
    "Prepared",
    "ReplaySettings",
    "Replayer",
    "Tally",
    "Workload",
    "as_mapping",
    "check_capacities",
    "count",
    "policy_vault",
    "prepare",
    "replay_one",
    "runs_of",
    "state_base",
    "tenant_namespace",
]
