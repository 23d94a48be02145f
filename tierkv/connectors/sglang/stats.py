"""What the backend did since SGLang last asked: pages and bandwidth per prefetch and backup call.

SGLang's storage metrics (``--enable-cache-report``/``enable_storage_metrics``) call ``get_stats()`` on
the backend after each scheduler step and feed the lists of a ``StorageMetrics`` into its histograms
(``sglang:prefetch_pgs``, ``sglang:prefetch_bandwidth`` in GB/s, ``sglang:backup_*``), the shape
SGLang's Mooncake backend reports too. Counts are of pages that arrived verified or were acknowledged
by a vault, never of pages asked for.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Totals:
    """Running totals since the backend started (for logs and tests; SGLang gets the per-call lists)."""

    pages_loaded: int = 0
    pages_missed: int = 0
    pages_rejected: int = 0
    pages_landed: int = 0
    """Pages a transport received straight into their place (zero-copy path, no copy after the socket)."""
    pages_stored: int = 0
    pages_failed: int = 0
    bytes_loaded: int = 0
    bytes_stored: int = 0


@dataclass
class PageStats:
    """Per-call samples since the last :meth:`drain` (kept only with ``sampling``, so that nothing grows
    when no one drains) and :class:`Totals`; thread-safe."""

    sampling: bool = True
    prefetch_pgs: list[int] = field(default_factory=list)
    backup_pgs: list[int] = field(default_factory=list)
    prefetch_bandwidth: list[float] = field(default_factory=list)
    backup_bandwidth: list[float] = field(default_factory=list)
    totals: Totals = field(default_factory=Totals)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def loaded(
        self, pages: int, missed: int, rejected: int, landed: int, nbytes: int, seconds: float
    ) -> None:
        with self._lock:
            t = self.totals
            t.pages_loaded += pages
            t.pages_landed += landed
            t.pages_missed += missed
            t.pages_rejected += rejected
            t.bytes_loaded += nbytes
            if not self.sampling:
                return
            self.prefetch_pgs.append(pages)
            self.prefetch_bandwidth.append(_gbps(nbytes, seconds))

    def stored(self, pages: int, failed: int, nbytes: int, seconds: float) -> None:
        with self._lock:
            t = self.totals
            t.pages_stored += pages
            t.pages_failed += failed
            t.bytes_stored += nbytes
            if not self.sampling:
                return
            self.backup_pgs.append(pages)
            self.backup_bandwidth.append(_gbps(nbytes, seconds))

    def drain(self) -> tuple[list[int], list[int], list[float], list[float]]:
        """The samples since the last drain (prefetch pages, backup pages, prefetch GB/s, backup GB/s)."""
        with self._lock:
            out = (self.prefetch_pgs, self.backup_pgs, self.prefetch_bandwidth, self.backup_bandwidth)
            self.prefetch_pgs, self.backup_pgs = [], []
            self.prefetch_bandwidth, self.backup_bandwidth = [], []
            return out


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


__all__ = ["PageStats", "Totals"]
