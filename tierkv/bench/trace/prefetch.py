"""``tierkv bench trace --prefetch SIZE``: the same trace restored with and without predictive prefetch.

Two fresh vaults of one capacity (the largest of ``--capacities``, policy ``context`` so stored blocks
carry their parent keys) replay the trace side by side through the real pipeline
(:class:`~tierkv.tiering.ColdTier`, real encoded blobs, verified on restore). Per request and per side, as
an engine hook does it: look up the prompt's blocks, restore the leading run that hit (timed: the
restore latency the engine waits for), store the rest with its metadata. One side has a prefetch buffer
of ``SIZE`` bytes, the other none; the side that goes first alternates per request so drift on a loaded
machine falls on both. After each request the replay waits ``--prefetch-gap-ms`` (the engine's decode
time, when a background prefetch can run) before the next.

Reported: the share of restored blocks and bytes the prefetch side took from its buffer, the restore
latency per request on each side and the median of the per-request saving, and the prefetched bytes that
were never used (wasted).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tierkv.bench.common import Deadline
from tierkv.bench.trace.replay import Prepared, ReplaySettings, Workload, policy_vault
from tierkv.codec import LayerGroup
from tierkv.tiering import ColdTier, NumpyArrays, StreamSpec
from tierkv.tiering.prefetch import PrefetchStats

ON, OFF = "on", "off"


@dataclasses.dataclass(frozen=True)
class PrefetchSettings:
    buffer_bytes: int
    gap_s: float = 0.05
    timeout_s: float = 2.0


@dataclasses.dataclass
class Side:
    """One side's restores: blocks and bytes restored, from the buffer, and each request's latency."""

    blocks: int = 0
    nbytes: int = 0
    from_buffer: int = 0
    buffer_bytes: int = 0
    latency_s: dict[int, float] = dataclasses.field(default_factory=dict)

    def median_ms(self) -> float | None:
        values = list(self.latency_s.values())
        return statistics.median(values) * 1e3 if values else None


@dataclasses.dataclass
class PrefetchRun:
    fraction: float
    capacity_bytes: int
    settings: PrefetchSettings
    on: Side
    off: Side
    stats: PrefetchStats
    seconds: float

    def saved_ms(self) -> list[float]:
        """Per request restored on both sides: off latency minus on latency, in ms."""
        both = self.on.latency_s.keys() & self.off.latency_s.keys()
        return [(self.off.latency_s[i] - self.on.latency_s[i]) * 1e3 for i in sorted(both)]

    def as_dict(self) -> dict[str, Any]:
        saved = self.saved_ms()
        on, off = self.on, self.off
        return {
            "fraction": self.fraction,
            "capacity_bytes": self.capacity_bytes,
            "buffer_bytes": self.settings.buffer_bytes,
            "gap_s": self.settings.gap_s,
            "timeout_s": self.settings.timeout_s,
            "restores": len(saved),
            "blocks_restored": {ON: on.blocks, OFF: off.blocks},
            "bytes_restored": {ON: on.nbytes, OFF: off.nbytes},
            "blocks_from_prefetch": on.from_buffer,
            "bytes_from_prefetch": on.buffer_bytes,
            "block_share_from_prefetch": on.from_buffer / on.blocks if on.blocks else None,
            "byte_share_from_prefetch": on.buffer_bytes / on.nbytes if on.nbytes else None,
            "median_restore_ms": {ON: on.median_ms(), OFF: off.median_ms()},
            "median_saved_ms": statistics.median(saved) if saved else None,
            "wasted_bytes": self.stats.wasted_bytes,
            "prefetched_bytes": self.stats.fetched_bytes,
            "prefetch": dataclasses.asdict(self.stats),
            "seconds": self.seconds,
        }


class _Blocks:
    """One real encoded blob per block size: ``blob_bytes`` of float16 values with the block's header."""

    def __init__(self, blob_bytes: int, tokens: int) -> None:
        self.tokens = tokens
        values = max(1, (blob_bytes - 128) // 2)
        self.array: npt.NDArray[np.float16] = (
            np.random.default_rng(0).standard_normal(values).astype(np.float16)
        )
        self.out: npt.NDArray[np.float16] = np.empty((0, values), np.float16)

    def slots(self, n: int) -> Callable[[int], npt.NDArray[np.float16]]:
        if self.out.shape[0] < n:
            self.out = np.empty((n, self.array.shape[0]), np.float16)
        return self.out.__getitem__


def _request(tier: ColdTier[Any], spec: StreamSpec, r: Prepared, blocks: _Blocks, side: Side, i: int) -> None:
    """Look up, restore what hit (timed), store the rest with its metadata."""
    hit = tier.lookup(spec, r.keys[: r.lookable])
    if hit:
        expect = spec.expect(blocks.array.shape, blocks.tokens)
        t = time.perf_counter()
        got = tier.restore(spec, r.keys[:hit], expect, blocks.slots(hit), leading_only=True)
        side.latency_s[i] = time.perf_counter() - t
        side.blocks += len(got.decoded)
        side.nbytes += got.decoded_bytes
        side.from_buffer += got.prefetched
        side.buffer_bytes += got.decoded_bytes * got.prefetched // max(1, len(got.decoded))
        hit = got.leading
    rest = [(k, blocks.array, blocks.tokens) for k in r.keys[hit:]]
    metas = r.metas
    tier.store(spec, rest, {k: metas[j] for j, k in enumerate(r.keys) if j >= hit})


def replay_prefetch(
    work: Workload,
    replay: ReplaySettings,
    settings: PrefetchSettings,
    base: Path,
    advance: Callable[[], object],
    deadline: Deadline,
) -> PrefetchRun | None:
    """Both sides over the whole trace, interleaved; None when the time budget ran out first."""
    fraction = max(replay.capacities)
    capacity = int(work.working_set_bytes * fraction)
    blocks = _Blocks(replay.blob_bytes, work.block_tokens)
    sides = {ON: Side(), OFF: Side()}
    t0 = time.perf_counter()
    vault = (capacity, replay.sync, replay.protected_cap, replay.min_turnover)  # the same for both sides
    with (
        policy_vault(base / ON, "context", *vault) as c_on,
        policy_vault(base / OFF, "context", *vault) as c_off,
    ):
        tiers = {
            ON: ColdTier(
                c_on,
                NumpyArrays(),
                prefetch_bytes=settings.buffer_bytes,
                prefetch_timeout_s=settings.timeout_s,
            ),
            OFF: ColdTier(c_off, NumpyArrays()),
        }
        for i, r in enumerate(work.requests):
            if deadline.passed():
                return None
            spec = StreamSpec(r.namespace, LayerGroup.ATTENTION)
            for name in (ON, OFF) if i % 2 == 0 else (OFF, ON):
                _request(tiers[name], spec, r, blocks, sides[name], i)
            time.sleep(settings.gap_s)
            advance()
        tiers[ON].close()
        prefetcher = tiers[ON].prefetch
        assert prefetcher is not None
        stats = prefetcher.stats
    return PrefetchRun(
        fraction=fraction,
        capacity_bytes=capacity,
        settings=settings,
        on=sides[ON],
        off=sides[OFF],
        stats=stats,
        seconds=time.perf_counter() - t0,
    )


__all__ = ["PrefetchRun", "PrefetchSettings", "replay_prefetch"]
