"""Bounded background work for store-on-evict.

Stores run off the serving path, one at a time, with at most ``max_inflight`` jobs queued or running.
A submit beyond that blocks the caller until a slot frees (back-pressure): memory held by evicted
prefixes waiting to be shipped stays bounded, and every store has its own RPC deadline, so the wait
is bounded too. A failing job is logged and counted, never raised into the serving path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

logger = logging.getLogger(__name__)


class BoundedWorker:
    """A single background thread with a bounded number of jobs in flight."""

    def __init__(self, max_inflight: int = 4, name: str = "tierkv-store") -> None:
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self._slots = threading.BoundedSemaphore(max_inflight)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._pending: set[Future[None]] = set()
        self._closed = False
        self.max_inflight = max_inflight
        self.submitted = 0
        self.completed = 0
        self.failed = 0

    @property
    def inflight(self) -> int:
        with self._lock:
            return len(self._pending)

    def submit(self, job: Callable[[], None]) -> bool:
        """Run ``job`` in the background; blocks while ``max_inflight`` jobs are pending.

        Returns False (and drops the job) once the worker is closed.
        """
        if self._closed:
            return False
        self._slots.acquire()
        with self._lock:
            if self._closed:
                self._slots.release()
                return False
            future: Future[None] = self._pool.submit(self._run, job)
            self._pending.add(future)
            self.submitted += 1
        future.add_done_callback(self._done)
        return True

    def _run(self, job: Callable[[], None]) -> None:
        try:
            job()
        except Exception:
            with self._lock:
                self.failed += 1
            logger.exception("background store failed")
        else:
            with self._lock:
                self.completed += 1

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)
        self._slots.release()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job has finished; False if ``timeout`` passed first."""
        with self._lock:
            pending = list(self._pending)
        _, not_done = wait(pending, timeout=timeout)
        return not not_done

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new jobs, wait for the pending ones, stop the thread."""
        with self._lock:
            self._closed = True
        done = self.drain(timeout)
        self._pool.shutdown(wait=done, cancel_futures=not done)
        return done


__all__ = ["BoundedWorker"]
