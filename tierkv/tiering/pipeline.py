"""The store and restore steps every engine hook runs, written once.

Store: encode each block (codec per stream, :func:`~tierkv.tiering.spec.codec_for`) → byte-bounded
batches → put, each batch with the retention metadata of its blocks → count what was acknowledged.
Restore: get → verify each blob against the expected header → decode into the slots the hook provides →
count rejects → delete corrupt blobs from the vaults → report which blocks arrived. Both run on whatever
thread the hook calls them from and never raise for a vault failure (the storage turns those into
misses); a hook's own bookkeeping stays with the hook.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic

from tierkv.codec import Buffer
from tierkv.codec.landing import Renumbered
from tierkv.errors import TierKVError
from tierkv.limits import HOOK_PUT_BYTES
from tierkv.records import PutResult
from tierkv.retention import BlockMeta
from tierkv.tiering.arrays import A, Arrays, RowArrays, RowWindows
from tierkv.tiering.batches import byte_batches
from tierkv.tiering.behind import DecodeBehind, contiguous
from tierkv.tiering.prefetch import DEFAULT_TIMEOUT_S, Prefetcher
from tierkv.tiering.spec import Expect, StreamSpec
from tierkv.tiering.storage import BlobSink, Storage, put_tagged
from tierkv.tiering.target import Place, Rows, Target

logger = logging.getLogger(__name__)

MAX_PUT_BYTES = HOOK_PUT_BYTES
"""Blobs per put call are capped at this many bytes (well under the vaults' message limits)."""

Block = tuple[bytes, A, int]
"""``(key, array, tokens)``: one block to store; ``tokens`` goes into the blob header."""


@dataclass
class StoreTally:
    """What one store did, as the vaults' replies said: blobs offered, blobs stored, bytes of the stored
    ones (:class:`~tierkv.records.PutResult` per put).

    ``rejected`` blobs a vault refused and none stored (too large for its budget or the tenant's quota,
    or no room it could make); ``lagging`` stored blobs have fewer copies than replication asks.
    ``acked`` lists the keys stored.
    """

    sent: int = 0
    stored: int = 0
    stored_bytes: int = 0
    rejected: int = 0
    lagging: int = 0
    acked: list[bytes] = field(default_factory=list)

    @property
    def failed(self) -> int:
        """Blobs no vault acknowledged (refused ones included)."""
        return self.sent - self.stored

    def add(self, other: StoreTally) -> None:
        self.sent += other.sent
        self.stored += other.stored
        self.stored_bytes += other.stored_bytes
        self.rejected += other.rejected
        self.lagging += other.lagging
        self.acked.extend(other.acked)

    def count(self, batch: Mapping[bytes, bytes], result: PutResult) -> None:
        """One put of ``batch`` and what the vaults said of it."""
        unstored = set(result.unstored)
        self.sent += len(batch)
        self.stored += result.stored
        self.rejected += result.rejected
        self.lagging += result.lagging
        for key, blob in batch.items():
            if key not in unstored:
                self.stored_bytes += len(blob)
                self.acked.append(key)


@dataclass
class Restored:
    """What one restore did.

    ``decoded`` lists the indices (into the keys asked for) of the blocks that verified, in order; the
    n-th of them was written into ``out(n)``. ``rejected`` blobs failed verification (and were deleted
    from the vaults); ``decoded_bytes`` is the size of the decoded blobs, ``fetched_bytes`` of every blob
    received. ``get_s`` / ``decode_s`` split the wall time between the get and the work after it; blobs
    placed while they arrived (``place``) are verified and copied within ``get_s``. ``verify_s`` /
    ``place_s`` are the time spent verifying and decoding blobs and in the hook's ``place``, wherever
    it happened. ``gone`` lists
    the keys the vaults no longer hold: missing from the answer, or corrupt and deleted. ``prefetched``
    counts the blobs taken from the prefetch buffer instead of the vaults (verified all the same);
    ``landed`` the blobs received straight into the hook's ``rows`` (verified there, copied never).
    """

    asked: int
    prefetched: int = 0
    decoded: list[int] = field(default_factory=list)
    rejected: int = 0
    gone: list[bytes] = field(default_factory=list)
    decoded_bytes: int = 0
    fetched_bytes: int = 0
    get_s: float = 0.0
    decode_s: float = 0.0
    verify_s: float = 0.0
    place_s: float = 0.0
    landed: int = 0

    @property
    def leading(self) -> int:
        """Length of the leading run of blocks that arrived and verified."""
        return next((n for n, i in enumerate(self.decoded) if n != i), len(self.decoded))

    @property
    def failed(self) -> list[int]:
        """Indices of the blocks that did not arrive or did not verify."""
        good = set(self.decoded)
        return [i for i in range(self.asked) if i not in good]


class ColdTier(Generic[A]):
    """The pipeline over one :class:`~tierkv.tiering.storage.Storage` for one tensor type.

    Stateless apart from its settings and, with ``prefetch_bytes`` > 0, its prefetch buffer
    (:mod:`tierkv.tiering.prefetch`): one instance may be shared by every thread of a hook.
    """

    def __init__(
        self,
        storage: Storage,
        arrays: Arrays[A],
        *,
        max_put_bytes: int = MAX_PUT_BYTES,
        prefetch_bytes: int = 0,
        prefetch_timeout_s: float = DEFAULT_TIMEOUT_S,
        decode_behind: bool = False,
    ) -> None:
        """``decode_behind``: restores ``into`` a buffer (arrays that are :class:`RowWindows`) and
        ``leading_only`` restores into ``out`` decode each blob while the rest of the restore is still
        arriving (:mod:`tierkv.tiering.behind`): a gain where the link, not the codec, bounds a restore,
        a thread hand-off per run where it does not."""
        self.storage = storage
        self.arrays = arrays
        self.max_put_bytes = max_put_bytes
        self.decode_behind = decode_behind
        self.prefetch = (
            Prefetcher(storage, max_bytes=prefetch_bytes, timeout_s=prefetch_timeout_s)
            if prefetch_bytes > 0
            else None
        )

    def lookup(self, spec: StreamSpec, keys: Sequence[bytes], *, lease_ms: int = 0) -> int:
        """How many leading ``keys`` of ``spec`` the prefetch buffer and then the vaults hold; the vaults
        lease theirs for ``lease_ms`` (0: none) so that a load soon after finds them."""
        if not keys:
            return 0
        held = self.prefetch.leading(spec.namespace, spec.role, keys) if self.prefetch is not None else 0
        if held == len(keys):
            return held
        return held + self.storage.prefix_lookup(
            spec.namespace, keys[held:], role=spec.role, lease_ms=lease_ms
        )

    def lookup_all(self, specs: Iterable[StreamSpec], keys: Sequence[bytes], *, lease_ms: int = 0) -> int:
        """How many leading ``keys`` every stream of ``specs`` holds (a hit that needs them all, e.g. one
        namespace per tensor/pipeline-parallel rank): one :meth:`lookup` per stream, each only of the
        keys every stream before it held, so a miss anywhere ends it without asking the rest."""
        hits = len(keys)
        for spec in specs:
            if hits == 0:
                break
            hits = min(hits, self.lookup(spec, keys[:hits], lease_ms=lease_ms))
        return hits

    def store(
        self,
        spec: StreamSpec,
        blocks: Iterable[Block[A]],
        meta: Mapping[bytes, BlockMeta] | None = None,
    ) -> StoreTally:
        """Encode and put ``blocks`` in batches of at most ``max_put_bytes``.

        ``blocks`` is consumed lazily: a hook that copies blocks out of its cache on the fly holds at
        most one batch of blobs (and whatever its iterator holds) at a time. ``meta`` gives blocks their
        retention metadata by key (:func:`tierkv.retention.block_meta`); each put carries that of its
        own blocks, and a block without an entry is stored untagged.
        """
        tally = StoreTally()
        for batch in byte_batches(self._encoded(spec, blocks), self.max_put_bytes):
            tags = {k: meta[k] for k in batch if k in meta} if meta else None
            result = put_tagged(self.storage, spec.namespace, batch, spec.role, tags)
            tally.count(batch, result)
            if result.stored < len(batch):
                logger.info(
                    "%s: %d of %d blobs stored (%d refused)",
                    spec.role,
                    result.stored,
                    len(batch),
                    result.rejected,
                )
        return tally

    def _encoded(self, spec: StreamSpec, blocks: Iterable[Block[A]]) -> Iterator[tuple[bytes, bytes]]:
        codec = spec.codec
        for key, block, tokens in blocks:
            yield key, self.arrays.encode(block, codec, tokens, spec.layer_group)

    def restore(
        self,
        spec: StreamSpec,
        keys: Sequence[bytes],
        expect: Expect | Sequence[Expect],
        out: Callable[[int], A] | None = None,
        *,
        place: Place[A] | None = None,
        rows: Rows | None = None,
        leading_only: bool = False,
        into: A | None = None,
    ) -> Restored:
        """One get for ``keys``; every blob verified against ``expect`` and decoded into ``out(n)``.

        ``expect`` is one header for every key or one per key (e.g. a state's SSM and CONV blobs, which
        share a role). A hook that stores ``raw`` blobs in its cache's own dtype passes ``place`` instead
        of ``out``: each verified blob is then handed over as a view of the received bytes as soon as it
        arrives, and the hook's own copy into its cache is the only one (no decode buffer); a hook that
        also passes ``rows`` (where each key's values lie as bytes) has blobs received straight there
        where the transport can, and then nothing is copied at all. With
        ``leading_only`` decoding stops at the first block that is missing or corrupt (a hook that can
        only use a leading run; nothing is placed while it arrives then, but with ``decode_behind`` blobs
        are decoded into ``out`` as they arrive, one past a gap into a slot the hook does not use);
        otherwise every block is tried and the hook learns which failed. A hook that decodes into one
        buffer passes it as ``into`` (with :class:`RowArrays` and one ``expect`` for every key): the n-th
        good block goes into row n, every blob is verified first and the good ones are decoded together
        (:meth:`RowArrays.decode_rows`).
        Corrupt blobs are deleted from the vaults, so the next store of that prefix replaces them instead
        of every later restore failing on them again. With prefetch on, blobs come from the prefetch
        buffer first, and the chain's likely successors are prefetched after.
        """
        if place is not None and spec.codec != "raw":
            raise ValueError(f"place takes the values of raw blobs; {spec.codec} blobs are decoded into out")
        if into is not None:
            if out is not None or place is not None or leading_only:
                raise ValueError("into takes every good block; it goes without out, place and leading_only")
            return self._restore_rows(spec, keys, expect, into)
        target = Target(self.arrays, expect, out, place, rows)
        result = Restored(len(keys))
        if not keys:
            return result
        t = time.perf_counter()
        if self.decode_behind and leading_only and out is not None:
            blobs = self._get_behind(spec, keys, result, target)
        else:
            streamed = target.streams and not leading_only
            blobs = self._get(spec, keys, result, target if streamed else None)
            result.get_s = time.perf_counter() - t
        target.raise_error()
        result.fetched_bytes = sum(_size(b) for b in blobs if b is not None)
        t = time.perf_counter()
        corrupt, why = self._decode(blobs, keys, target, result, leading_only)
        result.decode_s = time.perf_counter() - t
        result.verify_s, result.place_s, result.landed = target.verify_s, target.place_s, target.landed
        self._settle(spec, keys, result, corrupt, why)
        return result

    def _get_behind(
        self, spec: StreamSpec, keys: Sequence[bytes], result: Restored, target: Target[A]
    ) -> Sequence[Buffer | int | None]:
        """:meth:`_get` with each blob decoded into ``out(i)`` by a worker while the rest arrives. In a
        leading-only restore the n-th good block of the leading run is key n, so slot and key agree; a
        blob past a missing or corrupt one is decoded into its own slot too, which the hook never uses
        (the restore reports only the leading run). ``get_s`` is the receive; what the worker still had
        to decode after it is ``decode_s``. The worker keeps torch's thread count for a new thread: with
        the caller's set on it (as :meth:`_restore_rows_behind` does), the transformers hook's own work
        right after the restore ran 15-30x slower on a 2-core machine (building the cache: 200-400 ms
        instead of 2-4 ms)."""
        t = time.perf_counter()
        with DecodeBehind(target.decode_run, window=BEHIND_WINDOW) as behind:
            blobs = self._get(spec, keys, result, behind)
            result.get_s = time.perf_counter() - t
        return blobs

    def _restore_rows(
        self, spec: StreamSpec, keys: Sequence[bytes], expect: Expect | Sequence[Expect], into: A
    ) -> Restored:
        """:meth:`restore` into the rows of ``into``: one get, then every blob verified, then decoded."""
        if not isinstance(self.arrays, RowArrays) or not isinstance(expect, Expect):
            raise ValueError("into needs arrays that decode rows and one expect for every key")
        if self.decode_behind and isinstance(self.arrays, RowWindows) and keys:
            return self._restore_rows_behind(self.arrays, spec, keys, expect, into)
        result = Restored(len(keys))
        if not keys:
            return result
        t = time.perf_counter()
        blobs = self._get(spec, keys, result, None)
        result.get_s = time.perf_counter() - t
        present = [
            (i, blob) for i, blob in enumerate(blobs) if blob is not None and not isinstance(blob, int)
        ]
        result.fetched_bytes = sum(len(blob) for _, blob in present)
        t = time.perf_counter()
        verdicts = self.arrays.decode_rows([blob for _, blob in present], into, expect)
        result.decode_s = result.verify_s = time.perf_counter() - t
        corrupt: list[bytes] = []
        why = ""
        for (i, blob), verdict in zip(present, verdicts, strict=True):
            if verdict is None:
                result.decoded.append(i)
                result.decoded_bytes += len(blob)
            else:
                why = why or f"block {i}: {verdict}"
                corrupt.append(keys[i])
                result.rejected += 1
        good = set(result.decoded)
        result.gone = [key for i, key in enumerate(keys) if i not in good]
        self._settle(spec, keys, result, corrupt, why)
        return result

    def _restore_rows_behind(
        self, arrays: RowWindows[A], spec: StreamSpec, keys: Sequence[bytes], expect: Expect, into: A
    ) -> Restored:
        """:meth:`_restore_rows` with each run of blobs decoded while the rest arrives: key ``i`` into row
        ``i`` (pieces of consecutive keys at once), then the good rows moved up so that the n-th good block
        lies in row n, as without."""
        result = Restored(len(keys))
        rows = _Rows(arrays, into, expect)
        t = time.perf_counter()
        with DecodeBehind(rows.decode, window=BEHIND_WINDOW, init=arrays.worker_init()) as behind:
            blobs = self._get(spec, keys, result, behind)
            result.get_s = time.perf_counter() - t
            for i, blob in enumerate(blobs):  # blobs the prefetch buffer held
                if blob is not None and not isinstance(blob, int):
                    behind.arrived(i, blob)
        result.decode_s = time.perf_counter() - t - result.get_s
        result.verify_s = behind.busy_s
        corrupt, why = rows.settle(keys, result)
        self._settle(spec, keys, result, corrupt, why)
        return result

    def _settle(
        self, spec: StreamSpec, keys: Sequence[bytes], result: Restored, corrupt: list[bytes], why: str
    ) -> None:
        """Delete the corrupt blobs from the vaults (logged once per restore) and prefetch what comes next."""
        if corrupt:
            logger.warning(
                "%s: %d of %d blobs rejected and deleted (first: %s)", spec.role, len(corrupt), len(keys), why
            )
            self.storage.delete(spec.namespace, corrupt, role=spec.role)
        if self.prefetch is not None and result.decoded:
            self.prefetch.request(spec.namespace, spec.role, keys)

    def _get(
        self, spec: StreamSpec, keys: Sequence[bytes], result: Restored, on_blob: BlobSink | None
    ) -> Sequence[Buffer | int | None]:
        """The blobs of ``keys``: from the prefetch buffer where it has them, the rest in one get. With
        ``on_blob`` that get hands its blobs over as they arrive and yields only their sizes."""
        if self.prefetch is None:
            return self._fetch(spec, keys, on_blob)
        with self.prefetch.foreground():
            taken = self.prefetch.take(spec.namespace, spec.role, keys)
            rest = [i for i in range(len(keys)) if i not in taken]
            sink = None if on_blob is None else Renumbered(on_blob, rest)
            fetched = self._fetch(spec, [keys[i] for i in rest], sink) if rest else []
        blobs: list[Buffer | int | None] = [None] * len(keys)
        for i, blob in [*taken.items(), *zip(rest, fetched, strict=True)]:
            blobs[i] = blob
        result.prefetched = len(taken)
        return blobs

    def _fetch(
        self, spec: StreamSpec, keys: Sequence[bytes], on_blob: BlobSink | None
    ) -> Sequence[Buffer | int | None]:
        if on_blob is None:
            return self.storage.get_buffers(spec.namespace, keys, role=spec.role)
        return self.storage.get_each(spec.namespace, keys, on_blob, role=spec.role)

    def close(self) -> None:
        """Stop prefetching (the storage is the hook's to close)."""
        if self.prefetch is not None:
            self.prefetch.close(timeout=5.0)

    def _decode(
        self,
        blobs: Sequence[Buffer | int | None],
        keys: Sequence[bytes],
        target: Target[A],
        result: Restored,
        leading_only: bool,
    ) -> tuple[list[bytes], str]:
        """Decode (or place) every blob not yet taken on arrival and fill ``result``; returns the keys of
        the blobs that failed verification and why the first of them failed (logged once per restore,
        not once per blob). An ``int`` is the size of a blob handed over while it arrived."""
        corrupt: list[bytes] = []
        why = ""
        for i, blob in enumerate(blobs):
            if blob is not None:
                try:
                    target.settle(i, len(result.decoded), blob)
                except TierKVError as exc:
                    why = why or f"block {i}: {exc}"
                    corrupt.append(keys[i])
                    result.rejected += 1
                else:
                    result.decoded.append(i)
                    result.decoded_bytes += _size(blob)
                    continue
            result.gone.append(keys[i])
            if leading_only:
                break
        return corrupt, why


BEHIND_WINDOW = 64
"""Blobs a restore that decodes behind the receive holds at most (copies awaiting their decode)."""


class _Rows(Generic[A]):
    """Where a restore decoded behind the receive put each key's values, and what failed."""

    def __init__(self, arrays: RowWindows[A], into: A, expect: Expect) -> None:
        self.arrays, self.into, self.expect = arrays, into, expect
        self.row: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.rejected: dict[int, TierKVError] = {}

    def decode(self, run: Sequence[tuple[int, bytes]]) -> None:
        """A :class:`DecodeBehind` run: each piece of consecutive keys into the rows from its first key
        (a piece with a bad blob packs its good ones up, so a key's row is at most its index)."""
        for piece in contiguous(run):
            first = piece[0][0]
            target = self.arrays.rows_from(self.into, first)
            verdicts = self.arrays.decode_rows([blob for _, blob in piece], target, self.expect)
            n = first
            for (i, blob), verdict in zip(piece, verdicts, strict=True):
                self.size[i] = len(blob)
                if verdict is None:
                    self.row[i] = n
                    n += 1
                else:
                    self.rejected[i] = verdict

    def settle(self, keys: Sequence[bytes], result: Restored) -> tuple[list[bytes], str]:
        """Move the n-th good block into row n (rows only ever move up, in order, so none is overwritten
        before it moved) and fill ``result``; the keys of corrupt blobs and why the first failed."""
        for n, i in enumerate(sorted(self.row)):
            if self.row[i] != n:
                self.arrays.move_row(self.into, self.row[i], n)
            result.decoded.append(i)
            result.decoded_bytes += self.size[i]
        result.fetched_bytes = sum(self.size.values())
        result.rejected = len(self.rejected)
        good = set(self.row)
        result.gone = [key for i, key in enumerate(keys) if i not in good]
        first = min(self.rejected, default=None)
        why = "" if first is None else f"block {first}: {self.rejected[first]}"
        return [keys[i] for i in sorted(self.rejected)], why


def _size(blob: Buffer | int) -> int:
    return blob if isinstance(blob, int) else len(blob)


__all__ = ["MAX_PUT_BYTES", "Block", "ColdTier", "Place", "Restored", "StoreTally"]
