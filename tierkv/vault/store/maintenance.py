"""The store's maintenance thread: the chores no request should wait for, run every interval."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import lmdb

log = logging.getLogger("tierkv.vault.store")


class Maintainer:
    """Runs ``chores`` in order every ``interval`` seconds on a daemon thread until :meth:`stop`; a chore
    that fails is logged and the next interval runs them all again (a store must not stop maintaining
    itself over one bad pass)."""

    def __init__(self, chores: Sequence[Callable[[], object]], interval: float) -> None:
        self._chores = tuple(chores)
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tierkv-store-maint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failing = ""
        while not self._stopped.wait(self._interval):
            try:
                for chore in self._chores:
                    chore()
            except lmdb.Error as exc:  # a damaged page fails every pass alike: said once, not each second
                if str(exc) != failing:
                    log.error("store maintenance failed: %s", exc)
                failing = str(exc)
            except Exception:
                log.exception("store maintenance failed")
            else:
                if failing:
                    log.info("store maintenance works again")
                failing = ""

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the thread (waiting up to ``timeout`` for a pass under way); False if it was stopped."""
        if self._stopped.is_set():
            return False
        self._stopped.set()
        self._thread.join(timeout)
        return True
