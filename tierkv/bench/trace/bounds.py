"""How far admission alone could take an online policy, and what a vault could predict it from.

The optimum with bypass wins by not storing blocks that will not be looked up soon. Two measurements say
how much of that an online policy could hope for:

- :class:`OracleAdmission` wraps any simulated cache and stores only the blocks the trace will look up
  again, ever or within ``horizon`` requests: the hit rate a policy with a perfect admission predictor
  would reach, evicting as the wrapped cache does.
- :func:`arrival_rates` measures how well what a vault sees when a block arrives predicts "looked up
  again within one LRU lifetime": the rate per class of stored block (the last block of a put, a put of
  one block) and, for blocks hit, per time since their last use.
- :func:`continuation_rates` measures the same for new blocks by how their conversation has gone on: how
  many times the chain they extend was extended before (a vault could count it per entry, with no tags),
  and how long ago it was last extended.

``scripts/retention_bounds.py`` prints both for every trace of docs/performance/retention.md.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Final

from tierkv.bench.trace.simulate import NEVER, Admission, Cache, LRUCache, Stream, next_uses, replay


class OracleAdmission(Admission):
    """``cache`` with an oracle for admission: a block is stored only if the trace looks it up again
    within ``horizon`` requests (None: ever)."""

    def __init__(self, cache: Cache, stream: Stream, horizon: int | None) -> None:
        super().__init__(cache, stream)
        self._uses = next_uses(stream)
        self._horizon = NEVER - 1 if horizon is None else horizon

    def admits(self, request: int, position: int) -> bool:
        use = self._uses[request][position]
        return use != NEVER and use - request <= self._horizon


def lru_lifetime(stream: Stream, capacity: int) -> int:
    """Requests a block stays in an LRU cache of ``capacity`` blocks: the capacity over the blocks it
    evicts per request (the trace's length when it evicts none)."""
    cache = LRUCache(capacity)
    replay(stream, cache)
    requests = len(stream.requests)
    return requests if not cache.evictions else max(1, capacity * requests // cache.evictions)


@dataclasses.dataclass
class ArrivalRates:
    """Share of blocks looked up again within ``horizon`` requests, per class: ``counts[c]`` blocks,
    ``soon[c]`` of them looked up again in time."""

    horizon: int
    counts: Counter[str] = dataclasses.field(default_factory=Counter)
    soon: Counter[str] = dataclasses.field(default_factory=Counter)

    def add(self, cls: str, soon: bool) -> None:
        self.counts[cls] += 1
        self.soon[cls] += soon

    def rate(self, cls: str) -> float | None:
        return self.soon[cls] / self.counts[cls] if self.counts[cls] else None


NEW: str = "new"
LAST_OF_PUT: str = "new: last block of its put"
SINGLE_PUT: str = "new: a put of one block"
HIT_RECENT: str = "hit: last used within a quarter lifetime"
HIT_STALE: str = "hit: last used a lifetime or more ago"
CLASSES: tuple[str, ...] = (NEW, LAST_OF_PUT, SINGLE_PUT, HIT_RECENT, HIT_STALE)


def arrival_rates(stream: Stream, horizon: int) -> ArrivalRates:
    """Rates of "looked up again within ``horizon`` requests" per class, in an unbounded cache (every
    block is stored on its first appearance; a lookup hits the leading blocks seen before)."""
    uses = next_uses(stream)
    last: dict[int, int] = {}
    out = ArrivalRates(horizon)
    for t, (ids, lookable) in enumerate(stream.requests):
        hit = 0
        while hit < lookable and ids[hit] in last:
            hit += 1
        for i, block in enumerate(ids):
            soon = uses[t][i] != NEVER and uses[t][i] - t <= horizon
            if i < hit:
                since = t - last[block]
                if 4 * since <= horizon or since >= horizon:
                    out.add(HIT_RECENT if 4 * since <= horizon else HIT_STALE, soon)
            elif block not in last:
                out.add(NEW, soon)
                if i == len(ids) - 1:
                    out.add(LAST_OF_PUT, soon)
                if len(ids) - hit == 1:
                    out.add(SINGLE_PUT, soon)
            last[block] = t
    return out


TURN_CAP: Final = 3
"""Turn counts are capped here (two bits per entry in a vault): 3 means "3 or more"."""
TURNS: tuple[str, ...] = ("turn 0", "turn 1", "turn 2", "turn 3+")
"""A new block's turn count: its chain's extensions before it (0: nothing hit, a fresh chain)."""
EXTENDED_RECENT: str = "chain extended within a quarter lifetime"
EXTENDED_STALE: str = "chain extended a lifetime or more ago"
EXTENDED_SECONDS: tuple[tuple[str, float, float], ...] = (
    ("chain extended < 10 s ago", 0.0, 10.0),
    ("chain extended ≥ 1 min ago", 60.0, float("inf")),
)
"""Classes by the seconds since the chain's previous extension (where the trace has timestamps)."""
FAN_OUTS: tuple[tuple[str, int], ...] = (
    ("parent's first extension", 0),
    ("parent extended once before", 1),
    ("parent extended 2-3 times before", 2),
    ("parent extended 4+ times before", 4),
)
"""Classes of a continued chain's new blocks by how many times their parent was extended before (a
branch point such as a shared document or system prompt, against a conversation's own last turn)."""
CONTINUATION_CLASSES: tuple[str, ...] = (
    *TURNS,
    EXTENDED_RECENT,
    EXTENDED_STALE,
    *(name for name, _, _ in EXTENDED_SECONDS),
    *(name for name, _ in FAN_OUTS),
)


def _since_classes(requests: int, seconds: float | None, horizon: int) -> list[str]:
    """The classes of a continued chain's new blocks by the time since its previous extension."""
    out = [EXTENDED_RECENT] if 4 * requests <= horizon else [EXTENDED_STALE] if requests >= horizon else []
    if seconds is not None:
        out += [name for name, low, high in EXTENDED_SECONDS if low <= seconds < high]
    return out


def _fan_out_class(before: int) -> str:
    return next(name for name, low in reversed(FAN_OUTS) if before >= low)


def continuation_rates(stream: Stream, horizon: int, times: Sequence[float | None]) -> ArrivalRates:
    """Rates of "looked up again within ``horizon`` requests" of new blocks (every block is stored on its
    first appearance) by how their chain went on. A request's new blocks extend its last hit block, their
    parent: they inherit its turn count plus one, capped at :data:`TURN_CAP` (0 when nothing hit), as a
    vault could count turns per entry. The parent's chain was last extended when the parent was stored or
    last given new blocks; ``times[t]`` is request ``t``'s timestamp in ms (None: none). Each parent's
    extensions are counted too (:data:`FAN_OUTS`)."""
    uses = next_uses(stream)
    turns: dict[int, int] = {}
    fan_out: Counter[int] = Counter()
    extended: dict[int, tuple[int, float | None]] = {}
    out = ArrivalRates(horizon)
    for t, (ids, lookable) in enumerate(stream.requests):
        hit = 0
        while hit < lookable and ids[hit] in turns:
            hit += 1
        new = [i for i in range(hit, len(ids)) if ids[i] not in turns]
        if not new:
            continue
        now = times[t]
        turn, classes = 0, [TURNS[0]]
        if hit:
            parent = ids[hit - 1]
            turn = min(TURN_CAP, turns[parent] + 1)
            then, stamp = extended[parent]
            seconds = None if now is None or stamp is None else (now - stamp) / 1000
            classes = [
                TURNS[turn],
                *_since_classes(t - then, seconds, horizon),
                _fan_out_class(fan_out[parent]),
            ]
            fan_out[parent] += 1
            extended[parent] = (t, now)
        for i in new:
            soon = uses[t][i] != NEVER and uses[t][i] - t <= horizon
            for cls in classes:
                out.add(cls, soon)
            turns[ids[i]] = turn
            extended[ids[i]] = (t, now)
    return out


__all__ = [
    "CLASSES",
    "CONTINUATION_CLASSES",
    "FAN_OUTS",
    "TURNS",
    "TURN_CAP",
    "ArrivalRates",
    "OracleAdmission",
    "arrival_rates",
    "continuation_rates",
    "lru_lifetime",
]
