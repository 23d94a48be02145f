"""``tierkv bench synthetic`` (the default): KV shaped like a real model, through real vaults, a sweep.

For each prompt length and codec, and ``repeats`` times, a fresh prompt's KV is stored the way a
connector stores it (encode on the inference side, one Put per batch of about ``batch_bytes``) and
restored the way an engine restores it (one prefix lookup, one BatchGet per batch, every blob verified
and decoded into the model's KV dtype, int8 with torch where it is installed: :mod:`.decoders`). Hybrid
shapes also store a recurrent-state snapshot every ``ssm_every`` tokens and at the last block boundary
(to ``ssm_cold``, always raw) and restore the one at the restore boundary. Raw restores are compared bit
for bit with what was stored; int8 quality is the SNR of the decoded values against the originals.

Throughput counts *KV bytes*: the bytes the engine gets back in its own dtype (what a prefill would
otherwise compute), so raw and int8 compare directly; wire throughput (blob bytes) is recorded too. The
vaults serve reads from the page cache right after the writes, as a busy vault does.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from rich.console import Console

from tierkv.bench.breakeven import PrefillModel, RestoreModel, break_even
from tierkv.bench.common import (
    BenchRun,
    Deadline,
    check_codecs,
    check_sweep,
    progress_bar,
    settings_document,
)
from tierkv.bench.decoders import NumpyDecoder, make_decoder
from tierkv.bench.link import LinkSpec
from tierkv.bench.record import RunMeta, median, percentile
from tierkv.bench.shapes import ModelShape
from tierkv.bench.vaults import VaultSet, VaultSettings, watched_vaults
from tierkv.client.cluster import KV_COLD, SSM_COLD
from tierkv.codec import Buffer, Expect, LayerGroup, decode, encode, max_abs_error, snr_db
from tierkv.codec.bits import to_float32
from tierkv.config import Config
from tierkv.errors import BenchError, CodecError
from tierkv.keys import Namespace, block_keys
from tierkv.tiering.behind import DecodeBehind

logger = logging.getLogger(__name__)

POOL_BLOCKS = 8
OVERLAP_CHOICES = ("on", "off", "both")
_SSM_EXTRA = b"tierkv-bench/ssm"


@dataclasses.dataclass(frozen=True)
class SyntheticSettings:
    shape: ModelShape
    lengths: tuple[int, ...] = (1024, 4096, 16384)
    codecs: tuple[str, ...] = ("raw", "int8")
    repeats: int = 3
    block_tokens: int = 16
    batch_bytes: int = 16 << 20
    ssm_every: int = 1024
    max_seconds: float = 120.0
    prefill: PrefillModel | None = None
    seed: int = 0
    decoder: str = "auto"
    decode_threads: int = 0
    """Threads of each torch decode (0: torch's default), the same in both restore paths."""
    overlap: str = "off"
    """Whether int8 restores decode while the rest arrives (``on``, contender ``int8+behind``), after
    each batch arrived (``off``, as the hooks do by default: ``int8``), or both, interleaved."""
    link: LinkSpec | None = None
    """The shaped link the run measures over (``--link``); its round trip is waited once per request."""

    def validate(self) -> None:
        check_sweep(
            self,
            min_length=self.block_tokens,
            what="one block",
            positive={
                "--block-tokens": self.block_tokens,
                "--batch-mib": self.batch_bytes,
                "--ssm-every": self.ssm_every,
            },
        )
        check_codecs(self.codecs)
        if self.decode_threads < 0:
            raise BenchError(
                f"--decode-threads must be 0 (torch's default) or more, got {self.decode_threads}"
            )
        if self.overlap not in OVERLAP_CHOICES:
            raise BenchError(f"--overlap: expected one of {', '.join(OVERLAP_CHOICES)}, got {self.overlap!r}")

    def contenders(self) -> list[tuple[str, bool]]:
        """``(codec, overlapped)`` measured at each length: raw is verified as it is viewed (nothing to
        overlap); a lossy codec decodes behind the receive, after it, or both, as ``overlap`` says."""
        ways = {"on": (True,), "off": (False,), "both": (True, False)}[self.overlap]
        return [(c, behind) for c in self.codecs for behind in ((False,) if c == "raw" else ways)]

    def round_trip(self) -> None:
        """The link's round trip, once per request (nothing without ``--link`` or a delay in it)."""
        if self.link is not None:
            self.link.round_trip()

    def as_dict(self) -> dict[str, Any]:
        prefill = None if self.prefill is None else self.prefill.as_dict()
        link = None if self.link is None else self.link.as_dict()
        return {**settings_document(self, drop=["prefill", "link"]), "prefill_model": prefill, "link": link}

    def blocks(self, tokens: int) -> int:
        return tokens // self.block_tokens

    def snapshot_blocks(self, tokens: int) -> list[int]:
        """Block boundaries with a state snapshot: every ``ssm_every`` tokens and the last full block."""
        if not self.shape.ssm_layers:
            return []
        last = self.blocks(tokens)
        stride = max(1, self.ssm_every // self.block_tokens)
        return sorted({*range(stride, last + 1, stride), last})

    def stored_bytes_bound(self) -> int:
        """Raw bytes one repeat of the longest length puts in the vaults (the self-started budget)."""
        n = max(self.lengths)
        kv = self.blocks(n) * self.block_tokens * self.shape.kv_bytes_per_token
        return kv + len(self.snapshot_blocks(n)) * self.shape.ssm_bytes_per_snapshot


@dataclasses.dataclass
class CellResult:
    """One prompt length with one codec, over its repeats. Times in seconds, per repeat or per batch.

    ``kv_bytes`` / ``ssm_bytes`` are the values in the model's dtype (what the engine gets back);
    ``*_wire_bytes`` are blob bytes as stored and moved.
    """

    tokens: int
    codec: str
    block_tokens: int
    overlapped: bool
    blocks: int
    kv_bytes: int
    ssm_bytes: int = 0
    snapshots_stored: int = 0
    kv_wire_bytes: int = 0
    ssm_store_wire_bytes: int = 0
    ssm_restore_wire_bytes: int = 0
    repeats: int = 0
    store_s: list[float] = dataclasses.field(default_factory=list)
    restore_s: list[float] = dataclasses.field(default_factory=list)
    lookup_s: list[float] = dataclasses.field(default_factory=list)
    encode_s: list[float] = dataclasses.field(default_factory=list)
    decode_s: list[float] = dataclasses.field(default_factory=list)
    ssm_store_s: list[float] = dataclasses.field(default_factory=list)
    ssm_restore_s: list[float] = dataclasses.field(default_factory=list)
    store_batch_s: list[float] = dataclasses.field(default_factory=list)
    restore_batch_s: list[float] = dataclasses.field(default_factory=list)
    restored_blocks: list[int] = dataclasses.field(default_factory=list)
    bit_exact: bool | None = None
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.repeats > 0 and all(b == self.blocks for b in self.restored_blocks) and not self.errors

    @property
    def contender(self) -> str:
        """The codec, and ``+behind`` where its blobs decode while the rest arrives (``--overlap``)."""
        return self.codec + ("+behind" if self.overlapped else "")

    @property
    def cached_tokens(self) -> int:
        """Tokens the stored blocks cover (a trailing partial block is never stored)."""
        return self.blocks * self.block_tokens

    @property
    def store_bytes(self) -> int:
        return self.kv_bytes + self.snapshots_stored * self.ssm_bytes

    @property
    def restore_bytes(self) -> int:
        """Bytes the engine gets back per restore: the KV and, for hybrids, one state snapshot."""
        return self.kv_bytes + (self.ssm_bytes if self.ssm_restore_wire_bytes else 0)

    def figures(self) -> dict[str, Any]:
        """Derived figures: medians over repeats, percentiles over batches."""
        restore_t = median(self.restore_s)
        wire_store = self.kv_wire_bytes + self.ssm_store_wire_bytes
        wire_restore = self.kv_wire_bytes + self.ssm_restore_wire_bytes
        return {
            "compression": self.kv_bytes / self.kv_wire_bytes if self.kv_wire_bytes else None,
            "kv_bytes_per_token": self.kv_bytes / self.cached_tokens,
            "stored_bytes_per_token": wire_store / self.cached_tokens,
            "store_gbps": _gbps(self.store_bytes, self.store_s),
            "restore_gbps": _gbps(self.restore_bytes, self.restore_s),
            "store_wire_gbps": _gbps(wire_store, self.store_s),
            "restore_wire_gbps": _gbps(wire_restore, self.restore_s),
            "encode_gbps": _gbps(self.store_bytes, self.encode_s),
            "decode_gbps": _gbps(self.kv_bytes, self.decode_s),
            "restore_tokens_per_s": self.cached_tokens / restore_t if restore_t else None,
            "restore_ms_per_1k_tokens": restore_t / self.cached_tokens * 1024 * 1000 if restore_t else None,
            "store_s_median": median(self.store_s),
            "restore_s_median": restore_t,
            "lookup_ms_median": _ms(median(self.lookup_s)),
            "store_batch_ms_p50": _ms(percentile(self.store_batch_s, 50)),
            "store_batch_ms_p99": _ms(percentile(self.store_batch_s, 99)),
            "restore_batch_ms_p50": _ms(percentile(self.restore_batch_s, 50)),
            "restore_batch_ms_p99": _ms(percentile(self.restore_batch_s, 99)),
            "missing_blocks": max((self.blocks - b for b in self.restored_blocks), default=0),
        }

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "complete": self.complete, **self.figures()}


@dataclasses.dataclass
class SyntheticResult(BenchRun):
    settings: SyntheticSettings
    cells: list[CellResult] = dataclasses.field(default_factory=list)
    quality: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    vaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    restore_models: dict[str, RestoreModel] = dataclasses.field(default_factory=dict)
    decoder: str = ""
    """What decoded int8 restores (``numpy`` or ``torch``: ``--decoder auto`` resolved)."""

    @property
    def ok(self) -> bool:
        return not self.errors and bool(self.cells) and all(c.complete for c in self.cells if c.repeats)

    def figures_document(self) -> dict[str, Any]:
        return {
            "vaults": self.vaults,
            "decoder": self.decoder,
            "codecs": self.quality,
            "results": [c.as_dict() for c in self.cells],
            "restore_models": {k: m.as_dict() for k, m in self.restore_models.items()},
        }


def _gbps(nbytes: float, seconds: Sequence[float]) -> float | None:
    """GB/s (10**9 bytes) over the median time; None when nothing was timed."""
    t = median(seconds)
    return nbytes / t / 1e9 if t else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _chunks(n: int, size: int) -> Iterator[range]:
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


class _Workload:
    """Source blocks and snapshots (a small pool reused under distinct keys) and the codec calls."""

    def __init__(self, settings: SyntheticSettings, rng: np.random.Generator) -> None:
        self.s = settings
        shape = settings.shape
        self.pool = [shape.random_block(settings.block_tokens, rng) for _ in range(POOL_BLOCKS)]
        self.snapshot = shape.random_ssm_state(rng) if shape.ssm_layers else None
        self.block_bytes = int(self.pool[0].nbytes)
        self.per_batch = max(1, settings.batch_bytes // self.block_bytes)
        self.decoder = make_decoder(
            settings.decoder,
            self.pool[0].shape,
            shape.dtype,
            settings.block_tokens,
            2 * self.per_batch,
            settings.decode_threads,
        )
        """Rows for two batches: one batch decodes while the next arrives (a ring, see ``decode_ring``)."""

    def encode_block(self, i: int, codec: str) -> bytes:
        return encode(
            self.pool[i % POOL_BLOCKS],
            codec=codec,
            tokens=self.s.block_tokens,
            dtype=self.s.shape.dtype,
            layer_group=LayerGroup.ATTENTION,
        )

    def encode_snapshot(self, tokens: int) -> bytes:
        assert self.snapshot is not None
        return encode(self.snapshot, codec="raw", tokens=tokens, layer_group=LayerGroup.SSM)

    def quality(self, codec: str) -> dict[str, Any]:
        """SNR and largest error of the codec on the pool, decoded into the model's dtype."""
        dtype = self.s.shape.dtype
        blobs = [self.encode_block(i, codec) for i in range(POOL_BLOCKS)]
        ref = np.concatenate([to_float32(b, dtype).reshape(-1) for b in self.pool])
        numpy = NumpyDecoder(self.pool[0].shape, dtype, self.s.block_tokens)
        dec = np.concatenate([to_float32(numpy.one(b, codec), dtype).reshape(-1) for b in blobs])
        wire = sum(len(b) for b in blobs)
        snr = snr_db(ref, dec)
        return {
            "codec": codec,
            "lossless": math.isinf(snr) and snr > 0,
            "snr_db": snr,
            "max_abs_error": max_abs_error(ref, dec),
            "compression": sum(b.nbytes for b in self.pool) / wire,
            "blob_bytes": wire // POOL_BLOCKS,
            "block_bytes": self.block_bytes,
        }


def run_synthetic(
    config: Config, settings: SyntheticSettings, vault_settings: VaultSettings, console: Console
) -> SyntheticResult:
    """Run the sweep; never raises for a measurement problem (it lands in ``errors``), only for setup."""
    settings.validate()
    deadline = Deadline(settings.max_seconds)
    meta = RunMeta("synthetic", {**settings.as_dict(), "vaults": dataclasses.asdict(vault_settings)})
    result = SyntheticResult(meta, settings)
    rng = np.random.default_rng(settings.seed)
    work = _Workload(settings, rng)
    result.decoder = work.decoder.name
    result.quality = {c: work.quality(c) for c in settings.codecs}
    with watched_vaults(
        config,
        vault_settings.at_least(int(settings.stored_bytes_bound() * 1.25) + (64 << 20)),
        need_ssm=bool(settings.shape.ssm_layers),
        record=result.vaults,
        warnings=result.warnings,
    ) as vaults:
        run_id = uuid.uuid4().hex[:12]
        _warm_up(vaults, work, run_id)
        _sweep(vaults, work, settings, result, run_id, deadline, rng, console)
    _conclude(result)
    result.finish(deadline)
    return result


def _warm_up(vaults: VaultSet, work: _Workload, run_id: str) -> None:
    """One small put/get per codec first, so connection set-up is not measured."""
    for codec in work.s.codecs:
        ns = Namespace(
            model=f"tierkv-bench/warm-up/{run_id}", dtype=work.s.shape.dtype, codec=codec, layout="bench-v1"
        )
        keys = block_keys(np.arange(work.s.block_tokens * 2), work.s.block_tokens, namespace=ns)
        vaults.cluster.put(ns.digest, {k: work.encode_block(i, codec) for i, k in enumerate(keys)})
        vaults.cluster.get_buffers(ns.digest, keys)
        vaults.cluster.delete(ns.digest, keys)


def _sweep(
    vaults: VaultSet,
    work: _Workload,
    s: SyntheticSettings,
    result: SyntheticResult,
    run_id: str,
    deadline: Deadline,
    rng: np.random.Generator,
    console: Console,
) -> None:
    """Per length, each repeat runs every contender once, so outside load falls on all of them alike."""
    contenders = s.contenders()
    lengths = sorted(set(s.lengths))
    total = sum(2 * s.blocks(n) * s.repeats * len(contenders) for n in lengths)
    skipped: list[str] = []
    with progress_bar(console, total, percent=True) as bar:
        for n in lengths:
            cells = [_cell(work, n, codec, behind) for codec, behind in contenders]
            for rep in range(s.repeats):
                if result.out_of_time(deadline):
                    break
                for cell in cells:
                    bar.label(f"{s.shape.name} {n:,} tokens {cell.contender} ({rep + 1}/{s.repeats})")
                    _one_repeat(vaults, work, cell, run_id, rep, rng, bar.advance)
            result.cells += [cell for cell in cells if cell.repeats]
            skipped += [f"{n:,}/{cell.contender}" for cell in cells if not cell.repeats]
    if result.truncated:
        result.warnings.append(
            f"{deadline.note()}: "
            + (f"skipped {', '.join(skipped)}" if skipped else "fewer repeats than asked")
        )


def _cell(work: _Workload, tokens: int, codec: str, overlapped: bool) -> CellResult:
    s = work.s
    return CellResult(
        tokens=tokens,
        codec=codec,
        block_tokens=s.block_tokens,
        overlapped=overlapped,
        blocks=s.blocks(tokens),
        kv_bytes=s.blocks(tokens) * work.block_bytes,
        ssm_bytes=s.shape.ssm_bytes_per_snapshot,
    )


def _one_repeat(
    vaults: VaultSet,
    work: _Workload,
    cell: CellResult,
    run_id: str,
    rep: int,
    rng: np.random.Generator,
    advance: Callable[[int], object],
) -> None:
    s = work.s
    codec = cell.codec
    cluster = vaults.cluster
    ns = Namespace(
        model=f"tierkv-bench/{s.shape.name}/{run_id}",
        dtype=s.shape.dtype,
        codec=codec,
        layout="bench-v1",
        salt=f"{cell.tokens}/{rep}/{cell.contender}",
    )
    ids = rng.integers(0, 1 << 31, size=cell.tokens)
    keys = block_keys(ids, s.block_tokens, namespace=ns)
    snap_at = s.snapshot_blocks(cell.tokens)
    ssm_keys = block_keys(ids, s.block_tokens, extra=_SSM_EXTRA, namespace=ns) if snap_at else []
    settled = False
    try:
        store_s, encode_s, wire = 0.0, 0.0, 0
        for batch in _chunks(len(keys), work.per_batch):
            t0 = time.perf_counter()
            blobs = {keys[i]: work.encode_block(i, codec) for i in batch}
            t1 = time.perf_counter()
            s.round_trip()
            acked = cluster.put(ns.digest, blobs, role=KV_COLD).stored
            t2 = time.perf_counter()
            encode_s += t1 - t0
            store_s += t2 - t0
            cell.store_batch_s.append(t2 - t0)
            wire += sum(len(b) for b in blobs.values())
            if acked < len(blobs):
                cell.errors.append(f"store: {len(blobs) - acked} of {len(blobs)} blocks not acknowledged")
            advance(len(batch))
        ssm_store_s, ssm_wire = 0.0, 0
        for b in snap_at:
            t0 = time.perf_counter()
            blob = work.encode_snapshot(b * s.block_tokens)
            t1 = time.perf_counter()
            s.round_trip()
            if cluster.put(ns.digest, {ssm_keys[b - 1]: blob}, role=SSM_COLD).stored < 1:
                cell.errors.append(f"store: state snapshot at block {b} not acknowledged")
            ssm_store_s += time.perf_counter() - t0
            encode_s += t1 - t0
            ssm_wire += len(blob)
        restored, restore_s, decode_s, exact, ssm_restore_s, ssm_rwire = _restore(
            vaults, work, cell, ns.digest, keys, ssm_keys, snap_at, advance
        )
        settled = True
    except Exception:
        settled = True  # a failure, not an interrupt: what was stored goes as usual
        raise
    finally:
        # Interrupted (Ctrl-C, SIGTERM), vaults started here go with their files: no call that could wait
        # on a busy vault for the cluster's deadline stands between the user and the exit then.
        if settled or vaults.source != "local":
            cluster.delete(ns.digest, keys, role=KV_COLD)
            if snap_at:
                cluster.delete(ns.digest, [ssm_keys[b - 1] for b in snap_at], role=SSM_COLD)
    cell.repeats += 1
    cell.kv_wire_bytes = wire
    cell.ssm_store_wire_bytes = ssm_wire
    cell.snapshots_stored = len(snap_at)
    cell.ssm_restore_wire_bytes = ssm_rwire
    cell.store_s.append(store_s + ssm_store_s)
    cell.encode_s.append(encode_s)
    cell.ssm_store_s.append(ssm_store_s)
    cell.restore_s.append(restore_s + ssm_restore_s)
    cell.decode_s.append(decode_s)
    cell.ssm_restore_s.append(ssm_restore_s)
    cell.restored_blocks.append(restored)
    if exact is not None:
        cell.bit_exact = exact if cell.bit_exact is None else cell.bit_exact and exact
    if restored < cell.blocks:
        cell.errors.append(
            f"restore: {cell.blocks - restored} of {cell.blocks} blocks missing (vault budget too small, "
            "or evicted by other traffic)"
        )


def _restore(
    vaults: VaultSet,
    work: _Workload,
    cell: CellResult,
    namespace: bytes,
    keys: Sequence[bytes],
    ssm_keys: Sequence[bytes],
    snap_at: Sequence[int],
    advance: Callable[[int], object],
) -> tuple[int, float, float, bool | None, float, int]:
    """Lookup + batched gets + verify/decode; raw blocks are compared bit for bit (outside the timers)."""
    cluster = vaults.cluster
    t0 = time.perf_counter()
    work.s.round_trip()
    present = cluster.prefix_lookup(namespace, keys, role=KV_COLD)
    lookup = time.perf_counter() - t0
    cell.lookup_s.append(lookup)
    fetch = _fetch_behind if cell.overlapped else _fetch_then_decode
    restored, total, decode_s, exact = fetch(vaults, work, cell, namespace, keys[:present], advance)
    total += lookup
    advance(len(keys) - present)
    ssm_s, ssm_wire = 0.0, 0
    if snap_at and restored == len(keys):
        t0 = time.perf_counter()
        work.s.round_trip()
        (blob,) = cluster.get_buffers(namespace, [ssm_keys[snap_at[-1] - 1]], role=SSM_COLD)
        if blob is None:
            cell.errors.append("restore: the state snapshot at the restore boundary is missing")
        else:
            try:
                decode(blob, expect=Expect(LayerGroup.SSM))
                ssm_wire = len(blob)
            except CodecError as exc:
                cell.errors.append(f"restore: the state snapshot failed verification: {exc}")
        ssm_s = time.perf_counter() - t0
    return restored, total, decode_s, exact, ssm_s, ssm_wire


Fetched = tuple[int, float, float, bool | None]
"""Blocks restored, seconds the restore took, seconds spent decoding, raw blocks bit-exact (None: lossy)."""


def _fetch_then_decode(
    vaults: VaultSet,
    work: _Workload,
    cell: CellResult,
    namespace: bytes,
    keys: Sequence[bytes],
    advance: Callable[[int], object],
) -> Fetched:
    """Each batch received whole, then verified and decoded (raw: verified and viewed, never copied)."""
    total, decode_s, restored = 0.0, 0.0, 0
    exact: bool | None = True if cell.codec == "raw" else None
    for batch in _chunks(len(keys), work.per_batch):
        t0 = time.perf_counter()
        work.s.round_trip()
        bufs = vaults.cluster.get_buffers(namespace, [keys[i] for i in batch], role=KV_COLD)
        t1 = time.perf_counter()
        values, rejected = work.decoder.decode(bufs, cell.codec)
        t2 = time.perf_counter()
        cell.errors += [f"restore: a blob failed verification: {why}" for why in rejected]
        total += t2 - t0
        decode_s += t2 - t1
        cell.restore_batch_s.append(t2 - t0)
        for i, v in zip(batch, values, strict=True):
            if v is None:
                break
            restored += 1
            if exact:
                exact = bool(np.array_equal(v, work.pool[i % POOL_BLOCKS]))
        advance(len(batch))
    return restored, total, decode_s, exact


def _fetch_behind(
    vaults: VaultSet,
    work: _Workload,
    cell: CellResult,
    namespace: bytes,
    keys: Sequence[bytes],
    advance: Callable[[int], object],
) -> Fetched:
    """Every batch streamed (``get_each``), its blobs decoded on a worker while the rest arrive, and the
    next batch asked for while the worker finishes this one (:class:`~tierkv.tiering.behind.DecodeBehind`,
    at most two batches in flight, decoded into a ring of two batches' rows)."""
    rejected: list[str] = []

    def run(blobs: Sequence[tuple[int, Buffer]]) -> None:
        rejected.extend(work.decoder.decode_ring(blobs, cell.codec))

    sizes: list[int | None] = []
    t0 = time.perf_counter()
    with DecodeBehind(run, window=2 * work.per_batch) as behind:
        for batch in _chunks(len(keys), work.per_batch):
            tb = time.perf_counter()
            work.s.round_trip()
            sizes += vaults.cluster.get_each(
                namespace, [keys[i] for i in batch], _shifted(behind.arrived, batch.start), role=KV_COLD
            )
            cell.restore_batch_s.append(time.perf_counter() - tb)
            advance(len(batch))
    total = time.perf_counter() - t0
    cell.errors += [f"restore: a blob failed verification: {why}" for why in rejected]
    leading = next((n for n, size in enumerate(sizes) if size is None), len(sizes))
    return (leading if not rejected else 0), total, behind.busy_s, None


def _shifted(sink: Callable[[int, Buffer], None], first: int) -> Callable[[int, Buffer], None]:
    """A batch's ``on_blob``: its j-th key is the restore's ``first + j``-th."""
    return lambda j, blob: sink(first + j, blob)


def _conclude(result: SyntheticResult) -> None:
    """Restore models per codec, break-even against the given prefill model, the verdict."""
    s = result.settings
    for cell in result.cells:
        result.errors.extend(f"{cell.tokens:,} tokens {cell.codec}: {e}" for e in dict.fromkeys(cell.errors))
        if cell.codec == "raw" and cell.bit_exact is False:
            result.errors.append(f"{cell.tokens:,} tokens raw: restored blocks differ from the stored ones")
    for codec, behind in s.contenders():
        cells = [c for c in result.cells if (c.codec, c.overlapped) == (codec, behind) and c.complete]
        if not cells:
            continue
        points = [(c.cached_tokens, t) for c in cells for t in c.restore_s]
        # per token only the KV grows; a hybrid's one state snapshot per restore lands in the intercept
        bpt = s.shape.kv_bytes_per_token
        model = RestoreModel.fit(points, bytes_per_token=bpt, what="measured restores")
        name = cells[0].contender
        result.restore_models[name] = model
        if s.prefill is not None:
            result.breakeven[name] = break_even(s.prefill, model)
    result.verdict = synthetic_verdict(result)


def synthetic_verdict(result: SyntheticResult) -> str:
    if not result.ok:
        return result.failure("no measurement completed")
    shape = result.settings.shape.name
    longest = max(c.cached_tokens for c in result.cells)
    codec, model = min(result.restore_models.items(), key=lambda kv: kv[1].seconds(longest))
    rate = f"{model.tokens_per_s:,.0f} tokens/s"
    gbps = model.bytes_per_s
    if gbps is not None:
        rate += f" ({gbps / 1e9:.2f} GB/s of KV, {codec})"
    if not result.breakeven:
        return (
            f"Restores bring back {shape} KV at {rate}: tiering pays for long prompts wherever prefill is "
            "slower than that. Give --prefill-tps (or run --hf / --engine-api) for a break-even length."
        )
    be = result.breakeven[codec]
    at32 = next((x for x in be.savings if x.tokens == 32768), be.savings[-1])
    if be.tokens is None:
        return f"Restoring never beats recomputing here: restores run at {rate}, prefill is faster."
    return (
        f"Tiering pays above {be.tokens:,} tokens: restores at {rate} vs prefill {be.prefill.basis}; "
        f"at {at32.tokens // 1024}k tokens a restore takes {at32.restore_s:.2f} s "
        f"instead of {at32.prefill_s:.1f} s."
    )


__all__ = ["CellResult", "SyntheticResult", "SyntheticSettings", "run_synthetic", "synthetic_verdict"]
