"""Predictive prefetch: after a restore, fetch what the vaults expect next into a bounded host buffer.

When :class:`~tierkv.tiering.ColdTier` has restored a chain it hands the chain's keys to a
:class:`Prefetcher`. One background thread asks the vaults for the chain's likely successors
(``Successors``: the most-hit continuations and the chains the tenant usually fetches next) and fetches
them, a few keys per BatchGet, into a byte-bounded buffer. A later restore (or lookup) takes its blocks
from the buffer first and asks the vaults only for the rest, so a chain that follows its predecessor costs
no vault round trip.

Prefetch is best effort and always gives way:

- it never delays a foreground restore: it waits while one is running (between its own BatchGets), and
  a new request replaces one still waiting (the newest restore is the best guide);
- every job has one deadline (``timeout_s``) covering the Successors call and every fetch; a slow or hung
  vault makes it give up, counted, and a restore never waits on it;
- the buffer is bounded in bytes: the oldest unused blocks go first, counted as wasted.

Nothing unverified is handed out: a blob's checksum and header are verified when it enters the buffer (so
a blob that is no blob takes no room and is never counted as a hit), and the restore decodes it exactly as
a blob that came from the vaults (checksum again and the expected header, which only the restore knows).
The buffer holds immutable ``bytes`` that only this module touches, so taking them needs no third check.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Final

from tierkv.codec import Buffer, verify
from tierkv.errors import TierKVError
from tierkv.tiering.storage import Storage

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S: Final = 0.5
DEFAULT_MAX_KEYS: Final = 1024
FETCH_KEYS: Final = 64
"""Keys per prefetch BatchGet: small, so a foreground restore waits at most one of them."""
Slot = tuple[str, bytes, bytes]
"""(role, namespace, key) of a buffered blob."""


@dataclasses.dataclass
class PrefetchStats:
    """Counters of one prefetcher (all since it started).

    ``hits``/``hit_bytes``: blocks restores took from the buffer; ``wasted_bytes``: fetched blocks evicted
    (or left at close) unused; ``dropped``: requests replaced before they ran, or refused while closing;
    ``gave_up``: jobs cut short by their deadline or a vault failure; ``rejected``: blobs that failed
    verification on arrival."""

    requested: int = 0
    jobs: int = 0
    suggested: int = 0
    fetched: int = 0
    fetched_bytes: int = 0
    hits: int = 0
    hit_bytes: int = 0
    wasted: int = 0
    wasted_bytes: int = 0
    dropped: int = 0
    gave_up: int = 0
    rejected: int = 0
    waited_s: float = 0.0
    """Time jobs spent waiting for foreground restores to finish."""


@dataclasses.dataclass(frozen=True)
class _Request:
    namespace: bytes
    role: str
    keys: tuple[bytes, ...]


class _GaveUp(Exception):
    """The job's deadline passed (or the prefetcher is closing)."""


class Prefetcher:
    """A byte-bounded buffer of prefetched blobs and the one thread that fills it."""

    def __init__(
        self,
        storage: Storage,
        *,
        max_bytes: int,
        max_keys: int = DEFAULT_MAX_KEYS,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        fetch_keys: int = FETCH_KEYS,
    ) -> None:
        if max_bytes <= 0 or max_keys <= 0 or timeout_s <= 0 or fetch_keys <= 0:
            raise ValueError("max_bytes, max_keys, timeout_s and fetch_keys must be positive")
        self.storage = storage
        self.max_bytes = max_bytes
        self.max_keys = max_keys
        self.timeout_s = timeout_s
        self.fetch_keys = fetch_keys
        self.stats = PrefetchStats()
        self._buffer: collections.OrderedDict[Slot, bytes] = collections.OrderedDict()
        self._used = 0
        self._cond = threading.Condition()
        self._pending: _Request | None = None
        self._foreground = 0
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- the foreground side ---------------------------------------------------------------------

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Mark a foreground restore as running: prefetch fetches wait until none is."""
        with self._cond:
            self._foreground += 1
        try:
            yield
        finally:
            with self._cond:
                self._foreground -= 1
                self._cond.notify_all()

    def take(self, namespace: bytes, role: str, keys: Sequence[bytes]) -> dict[int, bytes]:
        """The buffered blobs of ``keys`` (by index), removed from the buffer. Not verified again: the
        buffer holds immutable ``bytes`` verified on arrival, and the restore's decode verifies them."""
        found: dict[int, bytes] = {}
        with self._cond:
            for i, key in enumerate(keys):
                blob = self._buffer.pop((str(role), namespace, key), None)
                if blob is not None:
                    self._used -= len(blob)
                    found[i] = blob
            self.stats.hits += len(found)
            self.stats.hit_bytes += sum(map(len, found.values()))
        return found

    def leading(self, namespace: bytes, role: str, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` the buffer holds (a lookup counts them without asking the vaults)."""
        with self._cond:
            return next(
                (n for n, k in enumerate(keys) if (str(role), namespace, k) not in self._buffer), len(keys)
            )

    def request(self, namespace: bytes, role: str, keys: Sequence[bytes]) -> None:
        """Prefetch what is likely to follow the chain ``keys``, in the background; never blocks."""
        if not keys:
            return
        with self._cond:
            if self._closed:
                self.stats.dropped += 1
                return
            self.stats.requested += 1
            if self._pending is not None:
                self.stats.dropped += 1
            self._pending = _Request(namespace, str(role), tuple(keys))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tierkv-prefetch", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    @property
    def buffered_bytes(self) -> int:
        with self._cond:
            return self._used

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread (a running job gives up at its next step); what is left unused is wasted."""
        with self._cond:
            self._closed = True
            if self._pending is not None:
                self.stats.dropped += 1
                self._pending = None
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            self.stats.wasted += len(self._buffer)
            self.stats.wasted_bytes += self._used
            self._buffer.clear()
            self._used = 0

    def drain(self, timeout: float) -> bool:
        """Wait until no job is pending or running (benchmarks and tests); False if ``timeout`` passed."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._pending is not None or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # -- the background side ---------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                job, self._pending = self._pending, None
                if self._closed or job is None:
                    return
                self._busy = True
                self.stats.jobs += 1
            try:
                self._run(job)
            except _GaveUp:
                with self._cond:
                    self.stats.gave_up += 1
            except Exception:  # a prefetch must never take the thread down
                log.exception("prefetch failed")
                with self._cond:
                    self.stats.gave_up += 1
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _run(self, job: _Request) -> None:
        deadline = time.monotonic() + self.timeout_s
        source = self.storage
        self._wait_for_foreground(deadline)
        hints = source.successors(
            job.namespace,
            job.keys,
            job.role,
            max_bytes=self.max_bytes,
            max_keys=self.max_keys,
            timeout=_left(deadline),
        )
        if time.monotonic() >= deadline:  # a vault that fails or hangs past the deadline answers nothing
            raise _GaveUp
        with self._cond:
            wanted = [h.key for h in hints if (job.role, job.namespace, h.key) not in self._buffer]
            self.stats.suggested += len(hints)
        for at in range(0, len(wanted), self.fetch_keys):
            chunk = wanted[at : at + self.fetch_keys]
            self._wait_for_foreground(deadline)
            blobs = source.get_buffers(job.namespace, chunk, job.role, timeout=_left(deadline))
            self._keep(job, chunk, blobs)
            if time.monotonic() >= deadline:
                raise _GaveUp

    def _wait_for_foreground(self, deadline: float) -> None:
        start = time.monotonic()
        with self._cond:
            try:
                while self._foreground and not self._closed:
                    self._cond.wait(_left(deadline))
            finally:
                self.stats.waited_s += time.monotonic() - start
            if self._closed:
                raise _GaveUp

    def _keep(self, job: _Request, keys: Sequence[bytes], blobs: Sequence[Buffer | None]) -> None:
        """Verify and buffer what arrived, evicting the oldest unused blobs to stay within the bound."""
        for key, blob in zip(keys, blobs, strict=True):
            if blob is None or len(blob) > self.max_bytes:
                continue
            data = bytes(blob)
            if not _verified(data):
                with self._cond:
                    self.stats.rejected += 1
                continue
            with self._cond:
                slot = (job.role, job.namespace, key)
                old = self._buffer.pop(slot, None)
                self._used -= len(old) if old is not None else 0
                while self._buffer and self._used + len(data) > self.max_bytes:
                    _, gone = self._buffer.popitem(last=False)
                    self._used -= len(gone)
                    self.stats.wasted += 1
                    self.stats.wasted_bytes += len(gone)
                self._buffer[slot] = data
                self._used += len(data)
                self.stats.fetched += 1
                self.stats.fetched_bytes += len(data)


def _verified(blob: Buffer) -> bool:
    try:
        verify(blob)
    except TierKVError:
        return False
    return True


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _GaveUp
    return left


__all__ = ["PrefetchStats", "Prefetcher"]
