"""What each capacity allows: the reference LRU and the offline optimum beside every vault run, and the
in-process replay of the policies that have a twin here (``--in-process``).

The headline figure of a run is the share of the gap between the reference LRU and the optimum with
bypass (the higher optimum, the one an admission policy competes with) that it closes:
``(run − lru) / (optimum − lru)`` in token hit rate; none where the gap is under a tenth of a point.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from tierkv.bench.trace.replay import ALL, PolicyRun, ReplaySettings, Workload, count
from tierkv.bench.trace.simulate import AdaptiveCache, Cache, LRUCache, Stream, belady, replay, stream_of
from tierkv.errors import BenchError

MIN_GAP: Final = 0.001
IN_PROCESS: Final[dict[str, Callable[[int, int], Cache]]] = {
    "lru": lambda budget, charge: LRUCache(budget // charge),
    "adaptive": lambda budget, charge: AdaptiveCache(budget // charge, budget=budget, size=charge),
}
"""Policies with an in-process twin that gives the vault's hits (from the budget and an entry's charge)."""


@dataclasses.dataclass(frozen=True)
class Reference:
    """Token hit rates at one capacity: the reference LRU, the optimum without and with bypass."""

    fraction: float
    blocks: int
    lru: float
    optimum: float
    optimum_bypass: float

    def closed(self, rate: float | None) -> float | None:
        """The share of the LRU → optimum (with bypass) gap that ``rate`` closes."""
        gap = self.optimum_bypass - self.lru
        return None if rate is None or gap < MIN_GAP else (rate - self.lru) / gap

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def work_stream(work: Workload) -> Stream:
    return stream_of([(r.keys, r.lookable) for r in work.requests], work.block_tokens, work.prompt_tokens)


def capacity_blocks(work: Workload, fraction: float) -> int:
    """Blocks a vault with ``fraction`` of the working set's bytes holds (its budget over the charge)."""
    return int(work.working_set_bytes * fraction) // work.charge


def references(work: Workload, stream: Stream, fractions: Sequence[float]) -> list[Reference]:
    out = []
    for fraction in fractions:
        blocks = capacity_blocks(work, fraction)
        out.append(
            Reference(
                fraction=fraction,
                blocks=blocks,
                lru=stream.token_rate(replay(stream, LRUCache(blocks))),
                optimum=stream.token_rate(belady(stream, blocks, bypass=False)),
                optimum_bypass=stream.token_rate(belady(stream, blocks, bypass=True)),
            )
        )
    return out


def in_process_run(
    work: Workload, stream: Stream, policy: str, fraction: float, settings: ReplaySettings
) -> PolicyRun:
    """``policy`` at ``fraction`` replayed by its twin (no vault: no bytes move, no tags are seen)."""
    make = IN_PROCESS.get(policy)
    if make is None:
        raise BenchError(f"--in-process: {policy!r} has no in-process twin (known: {', '.join(IN_PROCESS)})")
    t0 = time.perf_counter()
    cache = make(int(work.working_set_bytes * fraction), work.charge)
    hits = replay(stream, cache)
    hit_tokens = sum(hits) * work.block_tokens
    tallies = count(work.requests, hits)
    stored = tallies[ALL].stored if ALL in tallies else 0
    return PolicyRun(
        policy=policy,
        fraction=fraction,
        capacity_bytes=int(work.working_set_bytes * fraction),
        tallies=tallies,
        prompt_tokens=work.prompt_tokens,
        hit_tokens=hit_tokens,
        bytes_written=stored * work.charge,
        evictions=cache.evictions,
        evicted_bytes=cache.evictions * work.charge,
        stored_keys=len(cache),
        unacked=0,
        seconds=time.perf_counter() - t0,
        prefill_s_saved=hit_tokens / settings.prefill_tps,
        blob_bytes=settings.blob_bytes,
        vault_hits=sum(hits),
        in_process=True,
    )


__all__ = ["IN_PROCESS", "Reference", "capacity_blocks", "in_process_run", "references", "work_stream"]
