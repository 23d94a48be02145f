"""What a tenant is likely to fetch next, learned in memory from what it stores and fetches (Successors).

Two sources of evidence, both per tenant and namespace:

- the prefix tree: every Put that carries a parent key says "this block continues that one"; every
  BatchGet counts a hit on the blocks it found. A chain's likely continuation is its last block's most-hit
  child, that child's most-hit child, and so on;
- co-access: chains one tenant fetches within ``window_s`` of each other are linked, weighted by how often
  (an agent that reads its rules, then its tool results, then its memories does so every turn).

Each tenant's evidence lives in a bounded table of its own (:class:`TenantLearners`: entries and
approximate bytes, least recently touched dropped first, a share of the vault's bounds each), under a lock
of its own, with O(keys) work per call (at most :data:`MAX_CHILDREN` children per block and
:data:`MAX_SUGGEST_WORK` children looked at per answer) and no disk read, so recording never slows a read and
answering never opens a transaction. Only keys the vault still stores are suggested: the store reports
every entry it drops (:meth:`SuccessorLearner.forget`), and expired ones are skipped. A fetch of exactly
what was just suggested is taken for a prefetch and teaches nothing (else every suggestion would confirm
itself). The table is not persisted: after a restart the vault learns again.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from tierkv.retention.classes import BlockMeta

log = logging.getLogger(__name__)

DEFAULT_WINDOW_S: Final = 30.0
DEFAULT_MAX_ENTRIES: Final = 200_000
DEFAULT_MAX_BYTES: Final = 64 << 20
DEFAULT_SUGGEST_KEYS: Final = 64
DEFAULT_SUGGEST_BYTES: Final = 64 << 20
MAX_SUGGEST_KEYS: Final = 4096
MAX_CHAIN_KEYS: Final = 256
"""A co-accessed chain is remembered by at most this many of its keys (its first ones)."""
MAX_EDGES: Final = 16
"""Co-access links kept per chain (the weakest go first)."""
MAX_RECENT: Final = 8
"""Chains per tenant that a new fetch is linked with (those fetched within the window)."""
MAX_CHILDREN: Final = 1024
"""Children remembered per block. A block continued more ways than this is a shared prefix whose
continuations are one-offs: the ones past it are not linked, so no call walks 50,000 siblings."""
MAX_SUGGEST_WORK: Final = 65_536
"""Children one Successors call looks at, at most (it answers with what it found by then)."""
NODE_BYTES: Final = 200
"""Approximate fixed cost of one entry in the table, in bytes, on top of its keys."""
Clock = Callable[[], float]

Space = tuple[str, bytes]
"""(tenant, namespace)."""
NodeId = tuple[str, bytes, bytes]
"""(tenant, namespace, key)."""


@dataclasses.dataclass(slots=True)
class _Node:
    """One key as the learner knows it; ``size`` None when the vault does not (or no longer) store it.

    One is made for every key a Put stores, so it is slotted and its links are plain containers
    (a ``Counter`` costs more to make than the rest of the node)."""

    size: int | None = None
    expiry: float = 0.0
    parent: bytes = b""
    hits: int = 0
    children: set[bytes] = dataclasses.field(default_factory=set)
    edges: dict[bytes, int] = dataclasses.field(default_factory=dict)
    chain: tuple[bytes, ...] = ()
    """The keys of the chain that ended at this key when it was last fetched (co-access targets)."""

    def cost(self, key: bytes) -> int:
        keys = 1 + bool(self.parent) + len(self.children) + len(self.edges) + len(self.chain)
        return NODE_BYTES + keys * max(len(key), 1)

    def useful(self) -> bool:
        return self.size is not None or bool(self.children or self.edges or self.chain)


@dataclasses.dataclass(frozen=True)
class Suggestion:
    key: bytes
    size: int
    score: float


@dataclasses.dataclass
class _Recent:
    at: float
    space: Space
    chain: bytes


class SuccessorLearner:
    """The bounded table of stored keys, their children and hits, and co-access links between chains."""

    def __init__(
        self,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
    ) -> None:
        if window_s < 0 or max_entries < 1 or max_bytes < NODE_BYTES:
            raise ValueError("window_s >= 0, max_entries >= 1 and max_bytes >= 200 expected")
        self.window_s = window_s
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._nodes: collections.OrderedDict[NodeId, _Node] = collections.OrderedDict()
        self._bytes = 0
        self._recent: dict[str, collections.deque[_Recent]] = {}
        self._suggested: collections.OrderedDict[NodeId, float] = collections.OrderedDict()
        self.dropped_entries = 0

    # -- figures -----------------------------------------------------------------------------------

    @property
    def entries(self) -> int:
        return len(self._nodes)

    @property
    def used_bytes(self) -> int:
        return self._bytes

    # -- recording ---------------------------------------------------------------------------------

    def stored(
        self, tenant: str, namespace: bytes, items: Iterable[tuple[bytes, int, BlockMeta | None]]
    ) -> None:
        """Blocks a Put stored: ``(key, blob size, metadata or None)`` each."""
        now = self._wall()
        with self._lock:
            for key, size, meta in items:
                node = self._touch((tenant, namespace, key))
                self._set_stored(tenant, namespace, key, node, size, meta, now)
            self._shrink()

    def _set_stored(
        self,
        tenant: str,
        namespace: bytes,
        key: bytes,
        node: _Node,
        size: int,
        meta: BlockMeta | None,
        now: float,
    ) -> None:
        node.size = size
        node.expiry = now + meta.ttl_s if meta is not None and meta.ttl_s else 0.0
        parent = meta.parent if meta is not None else b""
        if node.parent != parent:  # the only change here that moves the node's cost
            before = node.cost(key)
            if node.parent:
                self._unlink(tenant, namespace, key, node.parent)
            node.parent = parent
            self._bytes += node.cost(key) - before
        if parent:
            up = self._touch((tenant, namespace, parent))
            if len(up.children) < MAX_CHILDREN:
                cost = up.cost(parent)
                up.children.add(key)
                self._bytes += up.cost(parent) - cost

    def fetched(self, tenant: str, namespace: bytes, keys: Sequence[bytes]) -> None:
        """A BatchGet of ``keys`` (a chain, in order): count hits, link it with the tenant's recent chains."""
        if not keys:
            return
        now = self._clock()
        with self._lock:
            if self._was_prefetch(tenant, namespace, keys, now):
                return
            for key in keys:
                node = self._nodes.get((tenant, namespace, key))
                if node is not None and node.size is not None:
                    node.hits += 1
            last = keys[-1]
            node = self._touch((tenant, namespace, last))
            before = node.cost(last)
            node.chain = tuple(keys[:MAX_CHAIN_KEYS])
            self._bytes += node.cost(last) - before
            self._link(tenant, (tenant, namespace), last, now)
            self._shrink()

    def _was_prefetch(self, tenant: str, namespace: bytes, keys: Sequence[bytes], now: float) -> bool:
        ids = [(tenant, namespace, k) for k in keys]
        if not all(now - self._suggested.get(i, -1e18) <= self.window_s for i in ids):
            return False
        for i in ids:
            self._suggested.pop(i, None)
        return True

    def _link(self, tenant: str, space: Space, chain: bytes, now: float) -> None:
        recent = self._recent.setdefault(tenant, collections.deque(maxlen=MAX_RECENT))
        while recent and now - recent[0].at > self.window_s:
            recent.popleft()
        for r in recent:
            if r.space != space or r.chain == chain:
                continue
            source = self._nodes.get((tenant, space[1], r.chain))
            if source is None:
                continue
            before = source.cost(r.chain)
            source.edges[chain] = source.edges.get(chain, 0) + 1
            if len(source.edges) > MAX_EDGES:
                weakest = min(source.edges, key=source.edges.__getitem__)
                del source.edges[weakest]
            self._bytes += source.cost(r.chain) - before
        for r in [r for r in recent if r.space == space and r.chain == chain]:
            recent.remove(r)  # each chain once: a chain fetched twice is not two links
        recent.append(_Recent(now, space, chain))

    def forget(self, dropped: Iterable[tuple[str, bytes, bytes]]) -> None:
        """Entries the vault no longer stores (deleted, evicted, overwritten), as (tenant, namespace, key)."""
        with self._lock:
            for nid in dropped:
                node = self._nodes.get(nid)
                if node is None or node.size is None:
                    continue
                tenant, namespace, key = nid
                node.size = None
                if node.parent:
                    before = node.cost(key)
                    self._unlink(tenant, namespace, key, node.parent)
                    node.parent = b""
                    self._bytes += node.cost(key) - before
                if not node.useful():
                    self._remove(nid)

    def forget_tenant(self, tenant: str | None, namespace: bytes | None = None) -> None:
        """Everything of a tenant (every tenant when None), or of one namespace of it (a Flush)."""
        with self._lock:
            gone = [
                nid
                for nid in self._nodes
                if (tenant is None or nid[0] == tenant) and (namespace is None or nid[1] == namespace)
            ]
            for nid in gone:
                self._remove(nid)

    # -- answering ---------------------------------------------------------------------------------

    def successors(
        self,
        tenant: str,
        namespace: bytes,
        keys: Sequence[bytes],
        *,
        max_bytes: int = DEFAULT_SUGGEST_BYTES,
        max_keys: int = DEFAULT_SUGGEST_KEYS,
    ) -> list[Suggestion]:
        """The blocks most likely fetched after ``keys``, best first, within ``max_bytes``/``max_keys``."""
        if not keys or max_keys <= 0 or max_bytes <= 0:
            return []
        now, wall = self._clock(), self._wall()
        with self._lock:
            scored = self._continuations(tenant, namespace, keys[-1], wall)
            scored += self._coaccessed(tenant, namespace, keys, wall)
            exclude = set(keys)
            out: list[Suggestion] = []
            total = 0
            for s in sorted(scored, key=lambda s: -s.score):
                if s.key in exclude:
                    continue
                if len(out) >= max_keys or total + s.size > max_bytes:
                    break
                exclude.add(s.key)
                out.append(s)
                total += s.size
            for s in out:
                self._suggested[(tenant, namespace, s.key)] = now
                self._suggested.move_to_end((tenant, namespace, s.key))
            while len(self._suggested) > MAX_SUGGEST_KEYS:
                self._suggested.popitem(last=False)
            return out

    def _stored(self, nid: NodeId, wall: float) -> _Node | None:
        node = self._nodes.get(nid)
        if node is None or node.size is None or (node.expiry and node.expiry <= wall):
            return None
        return node

    def _continuations(self, tenant: str, namespace: bytes, last: bytes, wall: float) -> list[Suggestion]:
        """Down the most-hit path from ``last``: every step scored by its share of its siblings' hits (times
        the step before), so deeper blocks rank lower and a sure path ranks near 1."""
        out: list[Suggestion] = []
        key, p, seen, work = last, 1.0, {last}, 0
        while work < MAX_SUGGEST_WORK:
            node = self._nodes.get((tenant, namespace, key))
            if node is None or not node.children:
                return out
            work += len(node.children)
            kids = [
                (c, n)
                for c in node.children
                if c not in seen and (n := self._stored((tenant, namespace, c), wall)) is not None
            ]
            if not kids:
                return out
            total = sum(n.hits + 1 for _, n in kids)
            best, bnode = max(kids, key=lambda cn: (cn[1].hits, cn[0]))
            p *= (bnode.hits + 1) / total
            assert bnode.size is not None
            out.append(Suggestion(best, bnode.size, p))
            key = best
            seen.add(key)
            if len(out) >= MAX_SUGGEST_KEYS:
                return out
        return out

    def _coaccessed(
        self, tenant: str, namespace: bytes, keys: Sequence[bytes], wall: float
    ) -> list[Suggestion]:
        """The chains fetched after chains this one passes through (a longer turn of a conversation
        passes through the end of the shorter one), each scored by its share of the links."""
        edges: collections.Counter[bytes] = collections.Counter()
        for key in keys[-MAX_CHAIN_KEYS:]:
            node = self._nodes.get((tenant, namespace, key))
            if node is not None:
                edges.update(node.edges)
        total = sum(edges.values())
        out: list[Suggestion] = []
        for target, weight in edges.most_common():
            chain = self._nodes.get((tenant, namespace, target))
            if chain is None:
                continue
            for key in chain.chain:
                found = self._stored((tenant, namespace, key), wall)
                if found is not None and found.size is not None:
                    out.append(Suggestion(key, found.size, weight / total))
        return out

    # -- the table ---------------------------------------------------------------------------------

    def _touch(self, nid: NodeId) -> _Node:
        node = self._nodes.get(nid)
        if node is None:
            node = self._nodes[nid] = _Node()
            self._bytes += node.cost(nid[2])
        else:
            self._nodes.move_to_end(nid)
        return node

    def _unlink(self, tenant: str, namespace: bytes, key: bytes, parent: bytes) -> None:
        up = self._nodes.get((tenant, namespace, parent))
        if up is None or key not in up.children:
            return
        before = up.cost(parent)
        up.children.discard(key)
        self._bytes += up.cost(parent) - before
        if not up.useful():
            self._remove((tenant, namespace, parent))

    def _remove(self, nid: NodeId) -> None:
        node = self._nodes.pop(nid, None)
        if node is None:
            return
        self._bytes -= node.cost(nid[2])
        if node.parent:
            self._unlink(nid[0], nid[1], nid[2], node.parent)

    def _shrink(self) -> None:
        """Drop least recently touched entries until both bounds hold."""
        while self._nodes and (len(self._nodes) > self.max_entries or self._bytes > self.max_bytes):
            nid = next(iter(self._nodes))
            self._remove(nid)
            self.dropped_entries += 1


class TenantLearners:
    """A :class:`SuccessorLearner` per tenant, each with its own lock and an equal share of the bounds, so
    one tenant's shape (a block with thousands of children) or call rate never holds up another's Puts
    and reads, and the whole stays within ``max_entries`` and ``max_bytes``."""

    def __init__(
        self,
        tenants: Sequence[str],
        *,
        window_s: float = DEFAULT_WINDOW_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
    ) -> None:
        share = max(1, len(tenants))
        self._learners = {
            t: SuccessorLearner(
                window_s=window_s,
                max_entries=max(1, max_entries // share),
                max_bytes=max(NODE_BYTES, max_bytes // share),
                clock=clock,
                wall=wall,
            )
            for t in tenants
        }

    def of(self, tenant: str) -> SuccessorLearner:
        """The tenant's learner (tenants come from the token table, fixed while the vault runs)."""
        return self._learners[tenant]

    @property
    def entries(self) -> int:
        return sum(learner.entries for learner in self._learners.values())

    @property
    def used_bytes(self) -> int:
        return sum(learner.used_bytes for learner in self._learners.values())

    def stored(
        self, tenant: str, namespace: bytes, items: Iterable[tuple[bytes, int, BlockMeta | None]]
    ) -> None:
        self.of(tenant).stored(tenant, namespace, items)

    def fetched(self, tenant: str, namespace: bytes, keys: Sequence[bytes]) -> None:
        self.of(tenant).fetched(tenant, namespace, keys)

    def forget(self, dropped: Iterable[tuple[str, bytes, bytes]]) -> None:
        by_tenant: dict[str, list[NodeId]] = collections.defaultdict(list)
        for nid in dropped:
            by_tenant[nid[0]].append(nid)
        for tenant, nids in by_tenant.items():
            if tenant in self._learners:
                self._learners[tenant].forget(nids)

    def forget_tenant(self, tenant: str | None, namespace: bytes | None = None) -> None:
        for name, learner in self._learners.items():
            if tenant is None or name == tenant:
                learner.forget_tenant(name, namespace)

    def successors(
        self,
        tenant: str,
        namespace: bytes,
        keys: Sequence[bytes],
        *,
        max_bytes: int = DEFAULT_SUGGEST_BYTES,
        max_keys: int = DEFAULT_SUGGEST_KEYS,
    ) -> list[Suggestion]:
        return self.of(tenant).successors(tenant, namespace, keys, max_bytes=max_bytes, max_keys=max_keys)


__all__ = ["DEFAULT_WINDOW_S", "SuccessorLearner", "Suggestion", "TenantLearners"]
