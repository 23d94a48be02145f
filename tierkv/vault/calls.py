"""The one scope every vault call runs in, whichever transport carried it.

:meth:`Calls.scope` checks that the vault is serving, finds the caller's principal from its token, times
the call, counts it by method and status, and turns what the handler raised into an :class:`Abort`:
a frame that does not parse is INVALID_ARGUMENT (RESOURCE_EXHAUSTED when over a limit), anything
unexpected is INTERNAL with its traceback in the log (rate-limited), never a raw exception on the wire.
Rejections are logged as one line per interval with counts, not one line per request, so hostile input
cannot fill the disk.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from tierkv.vault.admission import Admission, AdmissionLimits
from tierkv.vault.auth import Principal, TokenTable
from tierkv.vault.memory import MemoryTrimmer
from tierkv.vault.metrics import VaultMetrics
from tierkv.vault.status import Abort, Status
from tierkv.wire.framing import FrameError, FrameLimitError

log = logging.getLogger(__name__)

REJECT_LOG_INTERVAL_S = 10.0


class RejectLog:
    """Counts rejected calls by (method, status, reason) and logs them at most once per interval."""

    def __init__(self, interval_s: float = REJECT_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._last = time.monotonic()
        self._tracebacks = 0
        self._timer: threading.Timer | None = None

    def note(self, method: str, status: Status, details: str) -> None:
        reason = details.split(":", 1)[0][:80]
        with self._lock:
            self._counts[(method, status.name, reason)] += 1
            if self._timer is None:
                # the tail of a burst is logged even when no further rejection comes
                self._timer = threading.Timer(self.interval_s, self.flush)
                self._timer.daemon = True
                self._timer.start()
        self.flush(force=False)

    def allow_traceback(self) -> bool:
        """True for the first unexpected error of each interval (the rest are only counted)."""
        with self._lock:
            self._tracebacks += 1
            return self._tracebacks == 1

    def flush(self, *, force: bool = True) -> None:
        now = time.monotonic()
        with self._lock:
            if not self._counts or (not force and now - self._last < self.interval_s):
                return
            counts, self._counts = self._counts, collections.Counter()
            span, self._last, self._tracebacks = now - self._last, now, 0
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        total = sum(counts.values())
        detail = "; ".join(f"{n}× {m} {s} ({r})" for (m, s, r), n in counts.most_common(8))
        more = f"; {len(counts) - 8} more kinds" if len(counts) > 8 else ""
        log.info("rejected %d calls in the last %.0f s: %s%s", total, span, detail, more)


class Calls:
    """Serving state, auth, metrics and rejection log shared by every method on every transport."""

    def __init__(self, metrics: VaultMetrics, tokens: TokenTable, admission: Admission | None = None) -> None:
        self.metrics = metrics
        self.tokens = tokens
        self.admission = admission or Admission(AdmissionLimits())
        self.draining = threading.Event()
        self.rejects = RejectLog()
        self.memory = MemoryTrimmer()

    @contextlib.contextmanager
    def scope(
        self, method: str, token: bytes | None, connection: str, *, admit: bool = True
    ) -> Iterator[Principal]:
        """Run one call from ``connection`` (a name for the peer's connection); yields the caller once
        admitted (:mod:`.admission`; ``admit=False``: the caller admits itself once it has read the
        request, see :mod:`.bulk`). Whatever ends it is counted; only :class:`Abort` escapes."""
        start = time.perf_counter()
        status = Status.OK
        try:
            if self.draining.is_set():
                raise Abort(Status.UNAVAILABLE, "vault is shutting down")
            who = self.tokens.principal(token)
            with self.admission.admit(who.tenant, connection) if admit else contextlib.nullcontext():
                yield who
        except Abort as exc:
            status = exc.status
            self._reject(method, exc)
            raise
        except OSError:
            status = Status.CANCELLED  # the peer went away or stopped reading: nothing to answer
            raise
        except FrameError as exc:
            limit = isinstance(exc, FrameLimitError)
            abort = Abort(Status.RESOURCE_EXHAUSTED if limit else Status.INVALID_ARGUMENT, str(exc))
            status = abort.status
            self._reject(method, abort)
            raise abort from exc
        except Exception as exc:
            status = Status.INTERNAL
            if self.rejects.allow_traceback():
                log.exception("%s failed", method)
            self.rejects.note(method, status, type(exc).__name__)
            raise Abort(Status.INTERNAL, f"internal error ({type(exc).__name__})") from exc
        finally:
            self.metrics.requests.labels(method, status.name).inc()
            self.metrics.latency.labels(method).observe(time.perf_counter() - start)

    def _reject(self, method: str, exc: Abort) -> None:
        if exc.status is not Status.UNAVAILABLE:
            self.rejects.note(method, exc.status, exc.details)
