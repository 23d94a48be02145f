"""Put throughput of the store under each eviction policy, contenders interleaved, in steady-state eviction.

One store per policy (real LMDB, ``fast`` sync, in process: the policy's cost is the store's, not the
wire's), each filled past its budget first, then Put batches of new chained keys (one engine request
each, eight per timed call: the store evicts as much as it writes), with every fourth batch's first half read back first so
``adaptive`` also promotes, learns and feeds its shadows. Blob sizes 1 KiB, 64 KiB, 1 MiB; medians of
``--repeats`` interleaved rounds and the ratio to ``lru`` (the median of the rounds' ratios: contenders in
one round share its outside load), by the wall clock and by this process's CPU time (on a shared machine
the second is the steadier). The process tunes malloc as a vault does (:mod:`tierkv._malloc`), so the
large blobs' pages are reused rather than faulted in again on every write.

The contender ``adaptive-replayed`` tells the store's part of ``adaptive``'s cost from its learning's: a
first pass records every admission and every walk start ``adaptive`` chooses on the same workload, then
the replayed store gets those answers back with no learning behind them, so it reads, writes and evicts
exactly what ``adaptive`` does. The recorded calls are also replayed to a fresh ``adaptive`` with no store
around it: the learning's cost alone, per Put (best of three, the replay's own dispatch included). Run:

    python -m benchmarks.policy_put [--repeats 15] [--budget 32MiB] [--policies lru,adaptive] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.interleave import rounds
from tierkv._malloc import tune_malloc
from tierkv.config import parse_size
from tierkv.vault.policy import AdaptivePolicy, EvictionPolicy, Learner, make_policy
from tierkv.vault.store import Store

KiB, MiB = 1 << 10, 1 << 20
SIZES = {"1KiB": (KiB, 512), "64KiB": (64 * KiB, 64), "1MiB": (MiB, 4)}
"""Blob size and blocks per Put batch (a request's chain)."""
BATCHES_PER_CALL = 8
"""Batches per timed call: a call of one 4 MiB batch lasts a few milliseconds, too short to time on a
shared machine."""
REPLAYED = "adaptive-replayed"


Call = tuple[str, str, int, tuple[Any, ...]]
"""A call the store made: its name, the tenant and limit of the learner (or of ``observe``), its arguments."""


class _RecordingLearner:
    """A tenant's learner, noting every call the store makes and every answer it gives."""

    def __init__(self, inner: Learner, recording: _Recording, tenant: str, limit: int) -> None:
        self.inner, self.recording, self.tenant, self.limit = inner, recording, tenant, limit

    def admit(self, fkey: bytes, size: int, importance: float) -> bool:
        self.recording.calls.append(("admit", self.tenant, self.limit, (fkey, size, importance)))
        self.recording.admits.append(self.inner.admit(fkey, size, importance))
        return self.recording.admits[-1]

    def evicted(self, victim: tuple[bytes, int, bool]) -> None:
        self.recording.calls.append(("evicted", self.tenant, self.limit, (victim,)))
        self.inner.evicted(victim)

    def settle(self) -> None:
        self.recording.calls.append(("settle", self.tenant, self.limit, ()))
        self.inner.settle()

    def abandon(self) -> None:
        self.recording.calls.append(("abandon", self.tenant, self.limit, ()))
        self.inner.abandon()

    def walk_from(self, probation: int, main: int) -> bytes | None:
        start = self.inner.walk_from(probation, main)
        self.recording.calls.append(("walk_from", self.tenant, self.limit, (probation, main)))
        if start is not None:
            self.recording.starts.append(start)
        return start

    def walk_by_heads(self, probation_head: int | None, main_head: int | None) -> bytes:
        self.recording.calls.append(("walk_by_heads", self.tenant, self.limit, (probation_head, main_head)))
        self.recording.starts.append(self.inner.walk_by_heads(probation_head, main_head))
        return self.recording.starts[-1]


class _Recording(AdaptivePolicy):
    """``adaptive``, noting every admission and walk start it answers, and every call the store made."""

    def __init__(self) -> None:
        super().__init__()
        self.admits: list[bool] = []
        self.starts: list[bytes] = []
        self.calls: list[Call] = []

    def learner(self, tenant: str, limit: int) -> Learner:
        return _RecordingLearner(super().learner(tenant, limit), self, tenant, limit)

    def observe(self, tenant: str, limit: int, fkeys: Sequence[bytes], size: int, *, read: bool) -> None:
        self.calls.append(("observe", tenant, limit, (list(fkeys), size, read)))
        super().observe(tenant, limit, fkeys, size, read=read)


def _learning_alone(calls: Sequence[Call], start: int, tries: int = 3) -> float:
    """CPU seconds a fresh ``adaptive`` takes to answer the recorded calls from ``start`` on (after those
    before it), with no store around it: the learning's own cost (best of ``tries``)."""

    def run(policy: AdaptivePolicy, part: Sequence[Call]) -> None:
        learners: dict[tuple[str, int], Learner] = {}
        for name, tenant, limit, args in part:
            if name == "observe":
                policy.observe(tenant, limit, *args[:2], read=args[2])
                continue
            learner = learners.get((tenant, limit))
            if learner is None:
                learner = learners[(tenant, limit)] = policy.learner(tenant, limit)
            if name == "admit":
                learner.admit(*args)
            elif name == "evicted":
                learner.evicted(*args)
            elif name == "settle":
                learner.settle()
            elif name == "abandon":
                learner.abandon()
            elif name == "walk_from":
                learner.walk_from(*args)
            else:
                learner.walk_by_heads(*args)

    best = float("inf")
    for _ in range(tries):
        policy = AdaptivePolicy()
        run(policy, calls[:start])
        begin = time.process_time()
        run(policy, calls[start:])
        best = min(best, time.process_time() - begin)
    return best


class _ReplayedLearner:
    """A recording's answers in order, and nothing learned."""

    def __init__(self, admits: Iterator[bool], starts: Iterator[bytes]) -> None:
        self.admits, self.starts = admits, starts

    def admit(self, fkey: bytes, size: int, importance: float) -> bool:
        return next(self.admits)

    def evicted(self, victim: tuple[bytes, int, bool]) -> None:
        pass

    def settle(self) -> None:
        pass

    def abandon(self) -> None:
        pass

    def walk_from(self, probation: int, main: int) -> bytes | None:
        return next(self.starts)

    def walk_by_heads(self, probation_head: int | None, main_head: int | None) -> bytes:
        return next(self.starts)


class _Replayed(AdaptivePolicy):
    """A recording's answers in order, and nothing learned: the store does ``adaptive``'s work alone."""

    def __init__(self, recording: _Recording) -> None:
        super().__init__()
        self._admits, self._starts = iter(recording.admits), iter(recording.starts)

    def learner(self, tenant: str, limit: int) -> Learner:
        return _ReplayedLearner(self._admits, self._starts)

    def observe(self, tenant: str, limit: int, fkeys: Sequence[bytes], size: int, *, read: bool) -> None:
        pass

    def check_done(self) -> None:
        """The replay asked exactly what was recorded (else it did not retrace ``adaptive``'s run)."""
        if next(self._admits, None) is not None or next(self._starts, None) is not None:
            raise RuntimeError("the replay asked fewer questions than adaptive answered")


class Traffic:
    """Batches of new chained keys (one engine request's chain each); every fourth batch first reads half
    of the last one. A subclass sends them: :meth:`read` and :meth:`write`."""

    def __init__(self, blob: int, per_batch: int, name: str) -> None:
        self.per_batch = per_batch
        self.data = bytes(blob)
        self.counter = itertools.count()
        self.name = name
        self.last: list[bytes] = []

    def read(self, keys: list[bytes]) -> None:
        raise NotImplementedError

    def write(self, keys: list[bytes]) -> None:
        raise NotImplementedError

    def batch(self) -> None:
        n = next(self.counter)
        if n % 4 == 3 and self.last:
            self.read(self.last[: len(self.last) // 2])
        keys = [
            hashlib.blake2b(f"{self.name}/{n}/{i}".encode(), digest_size=16).digest()
            for i in range(self.per_batch)
        ]
        self.write(keys)
        self.last = keys

    def batches(self) -> None:
        for _ in range(BATCHES_PER_CALL):
            self.batch()


class Workload(Traffic):
    """:class:`Traffic` into one store, in process."""

    def __init__(self, store: Store, blob: int, per_batch: int, name: str) -> None:
        super().__init__(blob, per_batch, name)
        self.store = store

    def read(self, keys: list[bytes]) -> None:
        self.store.prefix_lookup(b"ns", keys)
        self.store.get_many(b"ns", keys)

    def write(self, keys: list[bytes]) -> None:
        self.store.put_many(b"ns", [(k, self.data, 0) for k in keys])


def cpu_timed(
    fn: Callable[[], None], into: list[float], clock: Callable[[], float] = time.process_time
) -> Callable[[], None]:
    """``fn``, also noting the CPU seconds per call by ``clock`` (this process's by default: what other
    tenants of a shared machine take does not count; the warm-up call is noted too and dropped)."""

    def call() -> None:
        start = clock()
        fn()
        into.append(max(clock() - start, 1e-9))

    return call


def paired_ratios(times: dict[str, list[float]]) -> dict[str, float]:
    """Each contender's throughput over ``lru``'s: the median over rounds of the round's ratio."""
    if "lru" not in times:
        return {}
    return {
        p: statistics.median(b / t for b, t in zip(times["lru"], ts, strict=True)) for p, ts in times.items()
    }


def _recorded(
    path: Path, budget: int, blob: int, per_batch: int, fill: int, calls: int
) -> tuple[_Recording, float]:
    """``adaptive``'s answers on the replayed store's workload (the same keys, fill and calls), and the
    microseconds per Put its learning takes on its own for the calls after the fill."""
    recording = _Recording()
    with Store(path, budget, sync_mode="fast", policy=recording) as store:
        load = Workload(store, blob, per_batch, REPLAYED)
        for _ in range(fill):
            load.batch()
        start = len(recording.calls)
        for _ in range(calls):
            load.batches()
    puts = calls * BATCHES_PER_CALL * per_batch
    return recording, _learning_alone(recording.calls, start) / puts * 1e6


def measure(policies: list[str], budget: int, repeats: int, base: Path) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for label, (blob, per_batch) in SIZES.items():
        fill = budget // (blob * per_batch) + 2
        made: dict[str, EvictionPolicy] = {p: make_policy(p) for p in policies if p != REPLAYED}
        alone = None
        if REPLAYED in policies:  # the warm-up call and the repeats
            recording, alone = _recorded(
                base / f"{label}-recording", budget, blob, per_batch, fill, repeats + 1
            )
            made[REPLAYED] = _Replayed(recording)
        stores = {p: Store(base / f"{label}-{p}", budget, sync_mode="fast", policy=made[p]) for p in policies}
        try:
            loads = {p: Workload(s, blob, per_batch, p) for p, s in stores.items()}
            for w in loads.values():
                for _ in range(fill):
                    w.batch()
            cpu: dict[str, list[float]] = {p: [] for p in loads}
            calls: dict[str, Callable[[], object]] = {
                p: cpu_timed(w.batches, cpu[p]) for p, w in loads.items()
            }
            times = rounds(calls, repeats)
            if isinstance(replayed := made.get(REPLAYED), _Replayed):
                replayed.check_done()
            nbytes = blob * per_batch * BATCHES_PER_CALL
            gbs = {p: statistics.median(nbytes / t / 1e9 for t in ts) for p, ts in times.items()}
            cpu_times = {p: ts[1:] for p, ts in cpu.items()}  # without the warm-up call
            cpu_gbs = {p: statistics.median(nbytes / t / 1e9 for t in ts) for p, ts in cpu_times.items()}
            out[label] = {
                "gb_per_s": gbs,
                "ratio_to_lru": paired_ratios(times),
                "cpu_gb_per_s": cpu_gbs,
                "cpu_ratio_to_lru": paired_ratios(cpu_times),
                "evictions": {p: s.stats().evictions for p, s in stores.items()},
                "learning_alone_us_per_put": alone,
            }
        finally:
            for s in stores.values():
                s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--budget", default="32MiB")
    ap.add_argument("--policies", default="lru,adaptive")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tune_malloc()
    with tempfile.TemporaryDirectory(prefix="tierkv-policy-put-") as tmp:
        result = measure(args.policies.split(","), parse_size(args.budget), args.repeats, Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for label, doc in result.items():
        gbs, ratio = doc["gb_per_s"], doc["ratio_to_lru"]
        assert isinstance(gbs, dict) and isinstance(ratio, dict)
        cpu = doc["cpu_ratio_to_lru"]
        assert isinstance(cpu, dict)
        cells = ", ".join(
            f"{p} {v:.3f} GB/s ({ratio.get(p, 1.0):.2f}x lru wall, {cpu.get(p, 1.0):.2f}x cpu)"
            for p, v in gbs.items()
        )
        alone = doc.get("learning_alone_us_per_put")
        print(
            f"{label:6} {cells}"
            + ("" if alone is None else f"; adaptive's learning alone {alone:.2f} us per Put")
        )


if __name__ == "__main__":
    main()
