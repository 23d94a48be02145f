"""Decoding a restore while the rest of it is still arriving.

Over a link slower than the codec, a restore that receives everything and then decodes pays for both
one after the other; with int8 blobs (half the bytes of raw) that throws away most of what the smaller
blobs bought. :class:`DecodeBehind` is a storage's ``on_blob`` (:data:`~tierkv.tiering.storage.BlobSink`)
that copies each blob as it arrives (a blob is valid only during its call; the copy runs at memory speed,
far above any link) and hands it to one worker thread, which decodes whatever has arrived since it last
looked in one call, so the next run decodes while the following blobs arrive. The worker's decoders
(numpy ufuncs, torch) release the GIL, so the receiving thread keeps reading meanwhile.

At most ``window`` blobs wait or decode at once: a receiver that outruns the decoder (loopback, a fast
link on a slow core) decodes what waits itself, or waits for the worker's run, instead of queueing more,
which bounds the copies held and lets a caller decode into a ring of ``window`` rows (``slot = index %
window``) without a row being overwritten before its blob was decoded. At the end the caller decodes what
still waits itself rather than wait for the worker to wake up (on a busy machine a wake-up can take
milliseconds). Runs never decode concurrently. Where the decoder, not the wire, is the bound this gains
nothing and costs a copy per blob and a hand-off per run: callers choose it per restore.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from tierkv.codec import Buffer

DecodeRun = Callable[[Sequence[tuple[int, bytes]]], None]
"""Decodes ``(index, blob)`` pairs, indices ascending; runs on the worker thread, never concurrently."""


class DecodeBehind:
    """A blob sink whose blobs are decoded by a worker thread in runs, as they arrive.

    Use as a context manager: leaving it waits until every blob handed over was decoded, and re-raises
    the first error the decoder raised (the worker stops taking blobs after one).
    """

    def __init__(
        self,
        decode_run: DecodeRun,
        *,
        window: int,
        name: str = "tierkv-decode-behind",
        init: Callable[[], object] | None = None,
    ) -> None:
        """``init`` runs first on the worker thread (e.g. to decode with the caller's thread count)."""
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._decode_run = decode_run
        self._init = init
        self._window = window
        self._pending: list[tuple[int, bytes]] = []
        self._held = 0
        self._closing = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._decoding = threading.Lock()
        self.busy_s = 0.0
        """Seconds spent decoding (mostly overlapped with receiving, so not a share of wall time)."""
        self.runs = 0
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def arrived(self, i: int, blob: Buffer) -> None:
        """``on_blob``: copy key ``i``'s blob and queue it. While ``window`` blobs are held, the calling
        thread decodes what waits itself (or waits for the worker's run to end) instead of queueing more."""
        data = bytes(blob)
        while True:
            with self._cond:
                if self._error is not None:
                    return  # decoding has stopped; close() raises its error
                if self._held < self._window:
                    self._pending.append((i, data))
                    self._held += 1
                    self._cond.notify_all()
                    return
                run = self._take()
                if run is None:
                    self._cond.wait()
                    continue
            self._help(run)

    __call__ = arrived

    def _take(self) -> list[tuple[int, bytes]] | None:
        """Everything that arrived since the last run, by index (None: nothing); called holding the lock."""
        run, self._pending = self._pending, []
        return sorted(run) if run else None

    def _decode(self, run: list[tuple[int, bytes]]) -> None:
        """One run, never two at once (the worker, or a caller helping out)."""
        with self._decoding:
            t0 = time.perf_counter()
            self._decode_run(run)
            with self._cond:
                self.busy_s += time.perf_counter() - t0
                self.runs += 1
                self._held -= len(run)
                self._cond.notify_all()

    def _help(self, run: list[tuple[int, bytes]]) -> None:
        """Decode ``run`` on the calling thread; an error is kept for close(), as the worker's is."""
        try:
            self._decode(run)
        except Exception as exc:
            with self._cond:
                self._error = self._error or exc
                self._cond.notify_all()

    def _work(self) -> None:
        try:
            if self._init is not None:
                self._init()
            while (run := self._next_run()) is not None:
                self._decode(run)
        except BaseException as exc:  # handed to the caller by close()
            with self._cond:
                self._error = self._error or exc
                self._cond.notify_all()

    def _next_run(self) -> list[tuple[int, bytes]] | None:
        """The worker's next run; None once closing and drained."""
        with self._cond:
            while not self._pending and not self._closing and self._error is None:
                self._cond.wait()
            return None if self._error is not None else self._take()

    def close(self) -> None:
        """Decode what still waits on the calling thread (no wake-up of the worker to wait for), wait for
        the worker's last run, and re-raise the first error a decode raised, if any."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        while True:
            with self._cond:
                run = None if self._error is not None else self._take()
            if run is None:
                break
            self._help(run)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def __enter__(self) -> DecodeBehind:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
            return
        with self._cond:  # failing already: stop the worker, keep the first error
            self._closing = True
            self._pending.clear()
            self._cond.notify_all()
        self._thread.join()


def contiguous(run: Sequence[tuple[int, bytes]]) -> list[Sequence[tuple[int, bytes]]]:
    """A run split where its indices stop being consecutive: each piece decodes into consecutive rows."""
    pieces: list[Sequence[tuple[int, bytes]]] = []
    start = 0
    for k in range(1, len(run) + 1):
        if k == len(run) or run[k][0] != run[k - 1][0] + 1:
            pieces.append(run[start:k])
            start = k
    return pieces


__all__ = ["DecodeBehind", "DecodeRun", "contiguous"]
