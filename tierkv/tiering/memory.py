"""An in-process :class:`~tierkv.tiering.storage.Storage` with the faults real vaults have, on demand.

For fast tests of the pipeline and of engine hooks: blobs live in a dict per (role, namespace), and a
test switches on what a vault does wrong (:class:`Faults`) — down (every call a miss), slow (each call
takes ``delay_s``; what does not arrive within the deadline is a miss, as with the cluster), corrupt
(gets return the blob with one byte flipped, so checksums catch it), evicting (at most ``capacity``
blobs; the oldest unleased go first). Time comes from an injected clock and sleep, so a test of a
deadline or a lease need not wait for one.

Hints are answered from what was stored: the successors of a chain are its continuation, each step the
most read stored child (by the ``parent`` of its metadata) of the block before; the hottest chains end
at blocks no other tagged block names as parent, walked to their root, hottest end first — close to the
vault's rules (:mod:`tierkv.vault.hottest`) for one vault that never forgets a read.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence

from tierkv.codec import Buffer
from tierkv.records import HotChain, PutResult, Successor
from tierkv.retention import BlockMeta
from tierkv.roles import Role
from tierkv.tiering.storage import BlobSink

Space = tuple[str, bytes]
"""(role, namespace)."""
DEFAULT_HOTTEST = 32


@dataclasses.dataclass
class Faults:
    """What the storage does wrong from now on; a test changes these at any moment."""

    down: bool = False
    """Every call fails as an unreachable vault does: puts store nothing, gets and lookups miss."""
    delay_s: float = 0.0
    """Each call takes this long (a slow vault); past the call's deadline it is a miss."""
    corrupt: bool = False
    """Gets return each blob with its last byte flipped."""
    capacity: int | None = None
    """At most this many blobs in all (None: no bound); a put evicts the oldest unleased first."""


class MemoryStorage:
    """Blobs in dicts, with :class:`Faults`, leases and hints.

    ``blobs`` is public so a test can corrupt or drop a stored blob; ``meta`` holds the metadata the
    last put of each key carried (a put without any drops it, as the vault does); ``calls`` counts
    operations by name (``"put"``, ``"get"``, ``"lookup"``, ``"delete"``, ``"successors"``,
    ``"hottest"``) so a test can check how often a hook asks; ``evicted`` lists what capacity pushed out.
    """

    def __init__(
        self,
        *,
        faults: Faults | None = None,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.faults = faults or Faults()
        self.timeout_s = timeout_s
        self.blobs: dict[Space, dict[bytes, bytes]] = defaultdict(dict)
        self.meta: dict[Space, dict[bytes, BlockMeta]] = defaultdict(dict)
        self.hits: Counter[tuple[Space, bytes]] = Counter()
        self.calls: dict[str, int] = defaultdict(int)
        self.evicted: list[tuple[Space, bytes]] = []
        self.closed = False
        self._leases: dict[tuple[Space, bytes], float] = {}
        self._order: dict[tuple[Space, bytes], None] = {}
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()

    # -- faults --------------------------------------------------------------------------------------

    def _answers(self, name: str, timeout: float | None = None) -> bool:
        """Count the call and take its time; False when it fails (down, or slower than its deadline)."""
        with self._lock:
            self.calls[name] += 1
        faults = self.faults
        deadline = self.timeout_s if timeout is None else timeout
        if faults.delay_s:
            self._sleep(min(faults.delay_s, deadline))
        return not faults.down and faults.delay_s <= deadline

    @staticmethod
    def _space(namespace: bytes, role: str) -> Space:
        return str(Role.parse(role)), namespace

    # -- blocks --------------------------------------------------------------------------------------

    def put(
        self,
        namespace: bytes,
        items: Mapping[bytes, bytes],
        role: str = Role.KV_COLD,
        *,
        meta: Mapping[bytes, BlockMeta] | None = None,
    ) -> PutResult:
        """What the dict holds after the put (a down or too slow storage stored nothing; capacity may push
        a blob of this very put out again)."""
        if not self._answers("put"):
            return PutResult(sent=len(items), unstored=tuple(items))
        space = self._space(namespace, role)
        with self._lock:
            blobs, tags = self.blobs[space], self.meta[space]
            for k, v in items.items():
                blobs[k] = bytes(v)
                self._order.pop((space, k), None)
                self._order[(space, k)] = None
                m = meta.get(k) if meta else None
                if m is None:
                    tags.pop(k, None)
                else:
                    tags[k] = m
            self._evict_over_capacity()
            unstored = tuple(k for k in items if k not in blobs)
            return PutResult(sent=len(items), stored=len(items) - len(unstored), unstored=unstored)

    def _evict_over_capacity(self) -> None:
        capacity = self.faults.capacity
        if capacity is None:
            return
        now = self._clock()
        excess = len(self._order) - capacity
        for space, key in list(self._order):
            if excess <= 0:
                break
            if self._leases.get((space, key), 0.0) > now:
                continue
            self._drop(space, key)
            self.evicted.append((space, key))
            excess -= 1

    def _drop(self, space: Space, key: bytes) -> bool:
        self._order.pop((space, key), None)
        self._leases.pop((space, key), None)
        self.meta[space].pop(key, None)
        return self.blobs[space].pop(key, None) is not None

    def get_buffers(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        role: str = Role.KV_COLD,
        *,
        timeout: float | None = None,
    ) -> list[Buffer | None]:
        if not self._answers("get", timeout):
            return [None] * len(keys)
        space = self._space(namespace, role)
        with self._lock:
            blobs = self.blobs[space]
            found: list[Buffer | None] = []
            for k in keys:
                blob = blobs.get(k)
                if blob is not None:
                    self.hits[(space, k)] += 1
                    self._leases.pop((space, k), None)
                    if self.faults.corrupt:
                        blob = blob[:-1] + bytes((blob[-1] ^ 0xFF,)) if blob else blob
                found.append(blob)
            return found

    def get_each(
        self, namespace: bytes, keys: Sequence[bytes], on_blob: BlobSink, role: str = Role.KV_COLD
    ) -> list[int | None]:
        found = self.get_buffers(namespace, keys, role)
        for i, blob in enumerate(found):
            if blob is not None:
                on_blob(i, blob)
        return [None if blob is None else len(blob) for blob in found]

    def prefix_lookup(
        self, namespace: bytes, keys: Sequence[bytes], role: str = Role.KV_COLD, *, lease_ms: int = 0
    ) -> int:
        """With ``lease_ms``, the blocks found are kept from eviction that long or until they are read."""
        if not self._answers("lookup"):
            return 0
        space = self._space(namespace, role)
        with self._lock:
            blobs = self.blobs[space]
            found = next((i for i, k in enumerate(keys) if k not in blobs), len(keys))
            if lease_ms > 0:
                until = self._clock() + lease_ms / 1000
                for k in keys[:found]:
                    self._leases[(space, k)] = until
            return found

    def delete(self, namespace: bytes, keys: Sequence[bytes], role: str = Role.KV_COLD) -> int:
        if not self._answers("delete"):
            return 0
        space = self._space(namespace, role)
        with self._lock:
            return sum(self._drop(space, k) for k in keys)

    def close(self) -> None:
        self.closed = True

    # -- hints ---------------------------------------------------------------------------------------

    def successors(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        role: str = Role.KV_COLD,
        *,
        max_bytes: int = 0,
        max_keys: int = 0,
        timeout: float | None = None,
    ) -> list[Successor]:
        if not keys or not self._answers("successors", timeout):
            return []
        space = self._space(namespace, role)
        with self._lock:
            blobs, tags = self.blobs[space], self.meta[space]
            out: list[Successor] = []
            total, last = 0, keys[-1]
            while not max_keys or len(out) < max_keys:
                children = [k for k, m in tags.items() if m.parent == last and k in blobs]
                if not children:
                    break
                last = max(children, key=lambda k: self.hits[(space, k)])  # the first stored of a tie
                size = len(blobs[last])
                if (max_bytes and total + size > max_bytes) or any(s.key == last for s in out):
                    break
                total += size
                out.append(Successor(last, size, float(1 + self.hits[(space, last)])))
            return out

    def hottest(
        self, namespace: bytes, *, limit: int = 0, tenant: str = "", role: str = Role.KV_COLD
    ) -> list[HotChain]:
        """``tenant`` is accepted and ignored: this storage has one tenant."""
        if not self._answers("hottest"):
            return []
        space = self._space(namespace, role)
        with self._lock:
            tags = {k: m for k, m in self.meta[space].items() if k in self.blobs[space]}
            parents = {m.parent for m in tags.values() if m.parent}
            ends = [k for k in tags if k not in parents]
            chains = [self._chain(space, end, tags) for end in ends]
        chains.sort(key=lambda c: c.hits, reverse=True)
        return chains[: limit or DEFAULT_HOTTEST]

    def _chain(self, space: Space, end: bytes, tags: Mapping[bytes, BlockMeta]) -> HotChain:
        """The chain from its root to ``end`` (as far as stored blocks go); token ids only if every
        block of it has them."""
        keys = [end]
        while (parent := tags[keys[-1]].parent) in tags and parent not in keys:
            keys.append(parent)
        keys.reverse()
        replayable = tags[keys[0]].parent == b"" and all(tags[k].tokens for k in keys)
        tokens = tuple(t for k in keys for t in tags[k].tokens) if replayable else ()
        return HotChain(tuple(keys), float(self.hits[(space, end)]), tags[keys[0]].source, tokens)


__all__ = ["Faults", "MemoryStorage"]
