"""Lookup leases: a block a PrefixLookup reported stays in the vault until the engine loads it.

Between an engine's lookup and its load (a few milliseconds) another client's puts may evict the very
blocks the lookup reported, and the load then fails. A lookup that asks for a lease (``lease_ms``) makes
eviction walk past those entries until the lease ends or a BatchGet of the same tenant reads them (as
Mooncake does). Leases live in memory only: a restart forgets them, and deletes and flushes ignore them.

Bounds, so that leases can never starve writers: at most :data:`MAX_LEASES` leases, each at most
:data:`MAX_LEASE_MS` long, and leased bytes under :data:`MAX_LEASED_FRACTION` of the budget. Past a bound
a lookup reports only the leading blocks it could lease (the rest counted as refused): an engine claims
only blocks that cannot go before it loads them.

Bounds are shares, not first come first served: of a vault with ``n`` tenants each may hold at most
``1/n`` of the leases and of the leased bytes (and never more than the fraction of its own quota), so one
tenant renewing leases on a quarter of the vault, or on 65,536 tiny blocks, cannot make every other
tenant's lookups report nothing.

The race a lease must close: a lookup reads the index, then grants; an eviction between the two (or one
in a write transaction that commits after the read) would remove a block the lookup reports. Every
eviction is therefore *claimed* here under the table's lock and numbered, and a grant refuses (and the
lookup stops counting at) any entry claimed since the lookup began — "began" meaning before the write
transaction in flight at that moment, whose evictions its snapshot may not show yet.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence

from tierkv.records import LeaseCounts

MAX_LEASE_MS = 10_000
"""A longer lease asked for is cut to this."""
MAX_LEASES = 1 << 16
"""Leases held at once, all tenants together."""
MAX_LEASED_FRACTION = 0.25
"""Leased bytes stay under this fraction of the tenant's quota (or the budget), and of the budget."""
EVICTION_HISTORY = 1 << 16
"""Evictions remembered for lookups in flight; a lookup that outlived more grants no lease."""

_Key = tuple[str, bytes]


class LeaseTable:
    """{(tenant, full key): (deadline, charge)} on a monotonic clock, thread-safe and bounded."""

    def __init__(
        self,
        max_bytes: int,
        *,
        max_leases: int = MAX_LEASES,
        fraction: float = MAX_LEASED_FRACTION,
        history: int = EVICTION_HISTORY,
        clock: Callable[[], float] = time.monotonic,
        tenants: int = 1,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_leases = max_leases
        self.tenants = max(1, tenants)
        """How many tenants share the bounds: each gets an equal share."""
        self.fraction = fraction
        self._history_cap = history
        self._clock = clock
        self._lock = threading.Lock()
        self._leases: dict[_Key, tuple[float, int]] = {}
        self._held: Counter[str] = Counter()
        self._bytes: Counter[str] = Counter()
        self._counts: dict[str, Counter[str]] = {}
        self._seq = 0
        self._writing_since: int | None = None
        self._evicted: OrderedDict[_Key, int] = OrderedDict()
        self._forgotten = 0
        """The newest eviction number dropped from the history."""
        self._armed = False
        """Set by the first lookup that asks for a lease: until then no lease exists and no lookup needs
        the history, so eviction skips it (a vault no client leases from pays nothing for leases)."""

    # -- writers -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around a write transaction that may evict: lookups that start meanwhile treat its evictions
        as later than themselves, since their snapshot may not show them."""
        with self._lock:
            self._writing_since = self._seq
        try:
            yield
        finally:
            with self._lock:
                self._writing_since = None

    def held(self, tenant: str) -> int:
        """Leases ``tenant`` holds (some possibly ended, not yet swept): how far eviction may walk."""
        return self._held[tenant]

    def leased(self, tenant: str, fkey: bytes) -> bool:
        """A live lease holds the entry."""
        if not self._leases:
            return False
        with self._lock:
            return self._live((tenant, fkey), self._clock())

    def claim(self, tenant: str, fkey: bytes, *, force: bool = False) -> bool:
        """Eviction asks for the entry: False (counted as honoured) while a lease holds it, unless
        ``force`` (an expired entry reads as a miss anyway); a claimed entry is numbered for lookups."""
        if not self._armed:  # evictions run inside writing(), which a lookup that arms sees (mark)
            return True
        key = (tenant, fkey)
        with self._lock:
            if self._leases:
                if not force and self._live(key, self._clock()):
                    self._count(tenant, "honoured")
                    return False
                self._end(key)
            self._seq += 1
            evicted = self._evicted
            evicted.pop(key, None)  # re-inserted last: the history stays in eviction order
            evicted[key] = self._seq
            if len(evicted) > self._history_cap:
                _, self._forgotten = evicted.popitem(last=False)
            return True

    # -- lookups -------------------------------------------------------------------------------------

    def mark(self) -> int:
        """Taken before a lookup opens its read transaction; passed to :meth:`grant`. The first one arms
        the history; one taken during the write that armed it is blind (that write's evictions so far
        went unrecorded), so it leases nothing."""
        with self._lock:
            if not self._armed:
                self._armed = True
                self._seq += 1
                self._forgotten = self._seq
            return self._seq if self._writing_since is None else self._writing_since

    def grant(
        self, tenant: str, entries: Sequence[tuple[bytes, int]], lease_ms: int, *, since: int, quota: int = 0
    ) -> int:
        """Lease the leading ``(full key, charge)`` entries a lookup found for ``lease_ms`` (capped);
        returns how many leading entries the lookup may report: it stops before one evicted since
        ``since`` and, when a lease was asked for, before the first one it could not lease (past a bound,
        or a lookup too old to know what was evicted), so a caller only ever claims leased blocks."""
        ms = min(max(0, lease_ms), MAX_LEASE_MS)
        with self._lock:
            now = self._clock()
            deadline = now + ms / 1000
            blind = since < self._forgotten
            share = self.max_bytes / self.tenants
            tenant_cap = self.fraction * min(share, quota or share)
            for i, (fkey, charge) in enumerate(entries):
                key = (tenant, fkey)
                if self._evicted.get(key, 0) > since:
                    self._count(tenant, "refused", len(entries) - i)
                    return i
                if not ms:
                    self._count(tenant, "refused")
                elif not blind and self._lease(key, deadline, charge, tenant_cap, now):
                    self._count(tenant, "granted")
                else:
                    self._count(tenant, "refused", len(entries) - i)
                    return i
            return len(entries)

    def _lease(self, key: _Key, deadline: float, charge: int, tenant_cap: float, now: float) -> bool:
        old = self._leases.get(key)
        if old is not None:
            self._leases[key] = (max(old[0], deadline), old[1])
            return True
        tenant = key[0]
        count_cap = max(1, self.max_leases // self.tenants)
        if len(self._leases) >= self.max_leases:
            self._sweep(now)
        if (
            len(self._leases) >= self.max_leases
            or self._held[tenant] >= count_cap
            or self._bytes[tenant] + charge > tenant_cap
            or self._bytes.total() + charge > self.fraction * self.max_bytes
        ):
            return False
        self._leases[key] = (deadline, charge)
        self._held[tenant] += 1
        self._bytes[tenant] += charge
        return True

    # -- ends ----------------------------------------------------------------------------------------

    def release(self, tenant: str, fkeys: Iterable[bytes]) -> None:
        """The entries were read (or deleted): their leases end."""
        if not self._held[tenant]:
            return
        with self._lock:
            for fkey in fkeys:
                self._end((tenant, fkey))

    def clear(self, tenants: Iterable[str]) -> None:
        """A flush: every lease of these tenants ends."""
        names = set(tenants)
        with self._lock:
            for key in [k for k in self._leases if k[0] in names]:
                self._end(key)

    def sweep(self) -> int:
        """End leases past their deadline (the maintenance thread calls this); how many ended."""
        with self._lock:
            return self._sweep(self._clock())

    def counts(self, tenants: Iterable[str] | None = None) -> LeaseCounts:
        with self._lock:
            names = list(self._counts) if tenants is None else list(tenants)
            total: Counter[str] = Counter()
            for name in names:
                total.update(self._counts.get(name, Counter()))
            return LeaseCounts(
                granted=total["granted"],
                honoured=total["honoured"],
                expired=total["expired"],
                refused=total["refused"],
                held=sum(self._held[n] for n in names),
                leased_bytes=sum(self._bytes[n] for n in names),
            )

    def _live(self, key: _Key, now: float) -> bool:
        lease = self._leases.get(key)
        if lease is None:
            return False
        if lease[0] > now:
            return True
        self._end(key)
        self._count(key[0], "expired")
        return False

    def _sweep(self, now: float) -> int:
        due = [k for k, (deadline, _) in self._leases.items() if deadline <= now]
        for key in due:
            self._end(key)
            self._count(key[0], "expired")
        return len(due)

    def _end(self, key: _Key) -> None:
        lease = self._leases.pop(key, None)
        if lease is not None:
            self._held[key[0]] -= 1
            self._bytes[key[0]] -= lease[1]

    def _count(self, tenant: str, what: str, n: int = 1) -> None:
        self._counts.setdefault(tenant, Counter())[what] += n
