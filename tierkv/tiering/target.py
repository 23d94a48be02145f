"""Where a restore's verified blobs go: decoded into slots, or placed straight from the received bytes.

A restore either decodes the n-th good block into ``out(n)`` (a buffer the hook scatters afterwards, or
its cache when that is one array), or, for ``raw`` blobs in the cache's own dtype, hands each verified
blob as a zero-copy view to ``place(i, values)``, which copies it into the cache: the only copy after
the socket. Placing is order-free, so it can happen while the rest of the reply is still arriving:
:meth:`Target.arrived` is the storage's ``on_blob`` and runs on whichever thread received the blob, so
verifying and copying one blob overlaps the vault sending the next.

A hook that also says where each key's values lie as bytes (``rows(i)``: its cache's own rows) gets
blobs received straight there where the transport can (:meth:`Target.land`, see
:mod:`tierkv.codec.landing`): the blob's header goes to a small buffer, its payload into the rows, and it
is verified where it lies (header, expectations, payload checksum over the rows). Nothing is copied
after the socket then; a blob that does not verify leaves garbage in rows the restore reports as failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic

from tierkv.codec import Buffer
from tierkv.codec.blob import verify_parts
from tierkv.codec.header import header_len
from tierkv.errors import TierKVError
from tierkv.tiering.arrays import A, Arrays, SlotArrays, ViewingArrays
from tierkv.tiering.spec import Expect

Place = Callable[[int, A], None]
"""Takes ``(index of the key, verified values)``: the values are a zero-copy view of a ``raw`` blob, valid
only during the call, which the hook copies straight into its cache."""

Rows = Callable[[int], Sequence[memoryview] | None]
"""Takes the index of a key: the writable byte rows its values go to, in order (memory that holds nothing
valid until the restore says so), or None where they do not lie as plain bytes."""


class Target(Generic[A]):
    """The destination of one restore; thread-safe for blobs placed as they arrive."""

    def __init__(
        self,
        arrays: Arrays[A],
        expect: Expect | Sequence[Expect],
        out: Callable[[int], A] | None,
        place: Place[A] | None,
        rows: Rows | None = None,
    ) -> None:
        if (out is None) == (place is None):
            raise ValueError("restore takes exactly one of out and place")
        self.viewer: ViewingArrays[A] | None = None
        if place is not None:
            if not isinstance(arrays, ViewingArrays):
                raise ValueError(f"{type(arrays).__name__} cannot view blobs: pass out, not place")
            self.viewer = arrays
        self.arrays = arrays
        self.expect = expect
        self.out = out
        self.place = place
        self.rows = rows if place is not None else None
        self.landed = 0
        """Blobs received straight into ``rows`` (and then verified, or not)."""
        self._lock = threading.Lock()
        self._early: dict[int, TierKVError | None] = {}
        self.verify_s = 0.0
        self.place_s = 0.0
        self._error: Exception | None = None

    @property
    def streams(self) -> bool:
        """Whether blobs can be taken as they arrive (placing is order-free, decoding into slots is not)."""
        return self.place is not None

    def nth(self, i: int) -> Expect:
        return self.expect if isinstance(self.expect, Expect) else self.expect[i]

    def take(self, i: int, n: int, blob: Buffer) -> None:
        """Verify the blob of key ``i`` and decode it into slot ``n`` or place it; raises
        :class:`TierKVError` when it does not verify. Time spent is added to ``verify_s`` (verifying and
        decoding) and ``place_s`` (the hook's copy)."""
        t0 = time.perf_counter()
        if self.out is not None:
            self.arrays.decode_into(blob, self.out(n), self.nth(i))
            t1 = time.perf_counter()
        else:
            assert self.place is not None and self.viewer is not None
            values = self.viewer.view(blob, self.nth(i))
            t1 = time.perf_counter()
            self.place(i, values)
        t2 = time.perf_counter()
        with self._lock:
            self.verify_s += t1 - t0
            self.place_s += t2 - t1

    def arrived(self, i: int, blob: Buffer) -> None:
        """A storage's ``on_blob``: place key ``i``'s blob now. Never raises: the outcome is kept for
        :meth:`settle`, and an unexpected error is raised by :meth:`raise_error` once the get is over."""
        self._verdict(i, lambda: self.take(i, i, blob))

    __call__ = arrived

    def decode_run(self, run: Sequence[tuple[int, bytes]]) -> None:
        """A :class:`~tierkv.tiering.behind.DecodeBehind` run of a leading-only restore: each key's blob
        into its own slot, ``out(i)`` (the verdicts kept for :meth:`settle`, as on arrival). Arrays that
        decode slots (:class:`SlotArrays`) take the whole run at once, where one expectation covers it and
        the blobs are not raw: torch's int8 costs ~0.2 ms a blob on CPU one by one, about half that in
        runs, which decides whether the worker keeps up with a link; a raw blob is one copy either way."""
        batch = self._batch()
        if batch is None:
            for i, blob in run:
                self.arrived(i, blob)
            return
        slots, out, expect = batch
        t0 = time.perf_counter()
        try:
            verdicts = slots.decode_slots([blob for _, blob in run], [out(i) for i, _ in run], expect)
        except Exception as exc:
            with self._lock:
                self._error = self._error or exc
            return
        with self._lock:
            self.verify_s += time.perf_counter() - t0
            self._early.update((i, verdict) for (i, _), verdict in zip(run, verdicts, strict=True))

    def _batch(self) -> tuple[SlotArrays[A], Callable[[int], A], Expect] | None:
        """What :meth:`decode_run` decodes a run at once with; None where it goes blob by blob."""
        if not isinstance(self.arrays, SlotArrays) or self.out is None or not isinstance(self.expect, Expect):
            return None
        return None if self.expect.codec == "raw" else (self.arrays, self.out, self.expect)

    def land(self, i: int, size: int) -> _Landed | None:
        """Where key ``i``'s blob of ``size`` bytes can be received: a header buffer, then its rows; None
        unless the hook gave rows and they hold exactly the payload of the blob expected."""
        if self.rows is None:
            return None
        expect = self.nth(i)
        if expect.codec != "raw" or expect.dtype is None or expect.shape is None:
            return None
        rows = self.rows(i)
        head = header_len(len(expect.shape))
        if rows is None or head + sum(len(r) for r in rows) != size:
            return None
        return _Landed(self, i, [memoryview(bytearray(head)), *rows], expect.dtype)

    def _verdict(self, i: int, check: Callable[[], object]) -> None:
        try:
            check()
            outcome: TierKVError | None = None
        except TierKVError as exc:
            outcome = exc
        except Exception as exc:
            with self._lock:
                self._error = self._error or exc
            return
        with self._lock:
            self._early[i] = outcome

    def settle(self, i: int, n: int, blob: Buffer | int) -> None:
        """Key ``i``'s verdict: the one reached while its blob arrived, or, for a blob that was not taken
        then (a prefetched one, or any when nothing streams), :meth:`take` into slot ``n`` now. ``blob``
        is the size of a blob handed over on arrival. Raises :class:`TierKVError` when it did not verify."""
        with self._lock:
            taken, rejected = i in self._early, self._early.get(i)
        if rejected is not None:
            raise rejected
        if not taken:
            assert not isinstance(blob, int), "a blob handed over on arrival always leaves a verdict"
            self.take(i, n, blob)

    def raise_error(self) -> None:
        """Re-raise the first unexpected error a placement hit on a receiving thread."""
        if self._error is not None:
            raise self._error


class _Landed:
    """One blob being received into a target's rows."""

    def __init__(self, target: Target[Any], i: int, buffers: list[memoryview], dtype: str) -> None:
        self.target, self.i, self.buffers, self.dtype = target, i, buffers, dtype

    def landed(self) -> None:
        target, expect = self.target, self.target.nth(self.i)
        t0 = time.perf_counter()
        target._verdict(
            self.i,
            lambda: verify_parts(self.buffers[0], self.buffers[1:], expect=expect.but(dtype=self.dtype)),
        )
        with target._lock:
            target.verify_s += time.perf_counter() - t0
            target.landed += 1

    def abandon(self) -> None:
        """Nothing to undo: the key has no verdict, so the restore counts it as not received."""


__all__ = ["Place", "Rows", "Target"]
