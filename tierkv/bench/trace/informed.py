"""What knowing the workload's present would buy: an informed online bound for the generated traces.

The offline optimum knows every future request; an online policy knows only what it has seen. Between
them is a policy that knows the generator's hidden state at every moment (:class:`~.conversations.
SessionState`: each live session's remaining turns and think-time mean, its app or document and how
popular that is, the arrival rate of new sessions) but not its future random draws. On the generated
traces that state gives every block a distribution of its time to next use:

- a session's next request comes after an exponential think time (memoryless: its mean whatever the time
  already waited) and resends the blocks its previous prompt carries (the whole prompt for chat and
  agents, the document for docs); a finished session's own blocks are never used again;
- a shared prefix (a system prompt, a tool description, a document) is used by every live session that
  starts with it, and by new sessions choosing it, at the arrival rate times its popularity.

Every one of those is an exponential clock, so a block's next use is exponential too, at the sum of its
users' rates: its expected time to next use is one over that sum (infinite with none), and the
probability of a use within ``h`` seconds is ``1 - exp(-rate * h)``.

- :class:`PresentForecast` keeps those rates from the generator's states, per group of blocks that share
  their users (a session's own blocks, a shared prefix, blocks nobody will use again).
- :class:`ExpectedBelady` is Belady's rule on expectations: it evicts the block whose expected next use is
  farthest (the deepest first among equals, as :func:`~.simulate.belady`) and does not store a block whose
  expected next use is farther than every held block's. Given :class:`FutureForecast`, whose "expectation"
  is the trace's actual next lookup, it is :func:`~.simulate.belady` with bypass.
- :class:`ForecastAdmission` wraps a cache (LRU) and stores only blocks whose next use is more likely than
  not within a horizon.
- :class:`HintedLRU` is LRU told only which blocks no one will use again: what an application's hint that
  a conversation has ended would give a vault.
- :class:`Knowledge` takes pieces of the state away (sessions' ends, their paces, new sessions'
  arrivals), to see what each is worth.

This is a heuristic, not the optimal online policy for the stochastic process (which would weigh every
future use, not the next one's mean): an estimate of what knowledge of the present buys, not a bound in
the strict sense.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Hashable, Iterable, Sequence
from typing import Final, Protocol

from tierkv.bench.trace.conversations import SessionState
from tierkv.bench.trace.simulate import Admission, Cache, LRUCache, Stream, next_uses

NEVER_USED: Final = ("never",)
"""The group of blocks no one will use again (a docs question, the tail of a finished prompt)."""


class Forecast(Protocol):
    """Expected times to next use, per group of blocks whose expectation is the same."""

    def advance(self, request: int) -> Iterable[Hashable]:
        """Learn request ``request``'s state (called once per request, in order, before its blocks are
        stored); the groups whose expectation changed."""

    def group(self, request: int, index: int) -> Hashable:
        """The group of block ``index`` of request ``request`` (after :meth:`advance` of that request)."""

    def expected(self, group: Hashable) -> float:
        """Expected time to the group's next use (``math.inf``: never)."""


@dataclasses.dataclass(frozen=True)
class Knowledge:
    """What of the present a :class:`PresentForecast` uses: each piece can be taken away, to see what it
    is worth."""

    ends: bool = True
    """Which sessions have no turn left (without it, every session is taken to go on)."""
    paces: bool = True
    """Each session's think-time mean (without it, every session's is ``common_think_s``)."""
    arrivals: bool = True
    """New sessions choosing a shared prefix (without it, only live sessions count as its users)."""
    common_think_s: float = 60.0


class PresentForecast:
    """Expected seconds to next use from the generator's states (one per request, in trace order)."""

    def __init__(
        self, states: Sequence[SessionState], block_tokens: int, knows: Knowledge = Knowledge()
    ) -> None:
        self._states = states
        self._block_tokens = block_tokens
        self._knows = knows
        self._live: dict[int, float] = {}
        """Live sessions (with turns left) and their rates of next request."""
        self._arrivals: dict[Hashable, float] = {}
        """Per shared prefix, new sessions per second that start with it."""
        self._shared_live: dict[Hashable, tuple[int, float]] = {}
        """Per shared prefix, how many live sessions start with it and their summed rates (zero exactly
        when none is left, whatever the rounding of the sums)."""

    def advance(self, request: int) -> list[Hashable]:
        state = self._states[request]
        changed: list[Hashable] = [("session", state.session)]
        for prefix in state.shared:
            key = ("shared", prefix.parts)
            self._arrivals[key] = state.arrival_rate * prefix.share if self._knows.arrivals else 0.0
            changed.append(key)
        was = self._live.pop(state.session, 0.0)
        think_s = state.think_s if self._knows.paces else self._knows.common_think_s
        now = 1.0 / think_s if state.left > 0 or not self._knows.ends else 0.0
        if now:
            self._live[state.session] = now
        for prefix in state.shared:
            key = ("shared", prefix.parts)
            users, rate = self._shared_live.get(key, (0, 0.0))
            users += (now > 0) - (was > 0)
            self._shared_live[key] = (users, rate - was + now if users else 0.0)
        return changed

    def group(self, request: int, index: int) -> Hashable:
        state = self._states[request]
        end = (index + 1) * self._block_tokens
        for prefix in state.shared:
            if end <= prefix.tokens:
                return ("shared", prefix.parts)
        return ("session", state.session) if end <= state.carried else NEVER_USED

    def rate(self, group: Hashable) -> float:
        """Uses per second (the rate of the group's exponential time to next use)."""
        if group == NEVER_USED:
            return 0.0
        if isinstance(group, tuple) and group[0] == "session":
            return self._live.get(group[1], 0.0)
        return self._arrivals.get(group, 0.0) + self._shared_live.get(group, (0, 0.0))[1]

    def expected(self, group: Hashable) -> float:
        rate = self.rate(group)
        return 1.0 / rate if rate > 0 else math.inf


class FutureForecast:
    """The trace's actual next lookup of each block as its "expectation": what the offline optimum knows.
    Each block is its own group."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._uses = next_uses(stream)
        self._next: dict[Hashable, float] = {}

    def advance(self, request: int) -> list[Hashable]:
        ids, _ = self._stream.requests[request]
        self._next.update(zip(ids, map(float, self._uses[request]), strict=True))
        return list(ids)

    def group(self, request: int, index: int) -> Hashable:
        return self._stream.requests[request][0][index]

    def expected(self, group: Hashable) -> float:
        return self._next.get(group, math.inf)


class ExpectedBelady:
    """Belady's rule on a forecast's expectations, with bypass (see the module text). Driven by
    :func:`~.simulate.replay`, which stores once per request, so the stores count the requests."""

    def __init__(self, capacity: int, stream: Stream, forecast: Forecast, *, bypass: bool = True) -> None:
        self.capacity = capacity
        self.evictions = 0
        self._stream = stream
        self._forecast = forecast
        self._bypass = bypass
        self._request = 0
        self._group_of: dict[int, Hashable] = {}
        self._members: dict[Hashable, list[tuple[int, int]]] = {}
        """Per group, its held blocks as a heap of (-depth, block): the deepest on top."""
        self._standing: dict[Hashable, tuple[float, int]] = {}
        """Per group with held blocks, (expected next use, depth of its deepest held block)."""
        self._heap: list[tuple[float, int, int, int, Hashable]] = []
        """(-expected, -depth, deepest block, push count, group): among equals the smallest block id
        goes first, as in :func:`~.simulate.belady` (a tie is not always harmless: a block never looked
        up again may still be stored again, past a prompt's lookable blocks)."""
        self._pushed = 0

    def __len__(self) -> int:
        return len(self._group_of)

    def holds(self, block: int) -> bool:
        return block in self._group_of

    def read(self, blocks: Sequence[int]) -> None:
        """Reads change no expectation: the forecast learns the request when its blocks are stored."""

    def store(self, blocks: Sequence[int]) -> None:
        t = self._request
        self._request += 1
        changed = set(self._forecast.advance(t))
        # a held block this request puts again keeps its standing until the put reaches it, as in
        # belady(): it is in use now, so it is not the one to evict for its parent
        waiting = changed & {self._group_of[b] for b in blocks if b in self._group_of}
        for group in changed - waiting:
            self._restand(group)
        ids, _ = self._stream.requests[t]
        for depth, block in enumerate(blocks, len(ids) - len(blocks)):
            held = self._group_of.get(block)
            if held in waiting:
                waiting.discard(held)
                self._restand(held)
            if held is not None or self.capacity <= 0:
                continue
            group = self._forecast.group(t, depth)
            if len(self._group_of) >= self.capacity:
                farthest = self._top()
                if self._bypass and farthest <= (self._forecast.expected(group), depth):
                    continue
                self._evict()
            self._add(block, group, depth)
        for group in waiting:
            self._restand(group)

    def _restand(self, group: Hashable) -> None:
        """Push the group's current standing (stale heap entries are skipped by :meth:`_top`)."""
        members = self._members.get(group)
        if not members:
            self._standing.pop(group, None)
            return
        depth, block = members[0]
        standing = (self._forecast.expected(group), -depth)
        if self._standing.get(group) != standing:
            self._standing[group] = standing
            self._pushed += 1
            heapq.heappush(self._heap, (-standing[0], depth, block, self._pushed, group))

    def _top(self) -> tuple[float, int]:
        while True:
            expected, depth, _, _, group = self._heap[0]
            if self._standing.get(group) == (-expected, -depth):
                return -expected, -depth
            heapq.heappop(self._heap)

    def _evict(self) -> None:
        self._top()
        group = self._heap[0][4]
        _, block = heapq.heappop(self._members[group])
        del self._group_of[block]
        self.evictions += 1
        self._restand(group)

    def _add(self, block: int, group: Hashable, depth: int) -> None:
        self._group_of[block] = group
        heapq.heappush(self._members.setdefault(group, []), (-depth, block))
        self._restand(group)


class HintedLRU(LRUCache):
    """LRU told which blocks no one will use again (a finished session's own, the tail of a prompt that
    is never resent): it does not store them and evicts them first, deepest first. What a vault could do
    with an application's hint that a conversation has ended."""

    def __init__(self, capacity: int, stream: Stream, forecast: Forecast) -> None:
        super().__init__(capacity)
        self._stream = stream
        self._forecast = forecast
        self._request = 0
        self._members: dict[Hashable, dict[int, int]] = {}
        """Per group, its held blocks and their depths."""
        self._group_of: dict[int, Hashable] = {}

    def store(self, blocks: Sequence[int]) -> None:
        t = self._request
        self._request += 1
        for group in self._forecast.advance(t):
            if self._forecast.expected(group) == math.inf:
                self._demote(group)
        ids, _ = self._stream.requests[t]
        order = self._order
        for depth, block in enumerate(blocks, len(ids) - len(blocks)):
            group = self._forecast.group(t, depth)
            if self._forecast.expected(group) == math.inf:
                continue
            order[block] = None
            order.move_to_end(block)
            self._group_of[block] = group
            self._members.setdefault(group, {})[block] = depth
            while len(order) > self.capacity:
                victim, _ = order.popitem(last=False)
                self.evictions += 1
                held = self._group_of.pop(victim, None)
                if held is not None:
                    del self._members[held][victim]

    def _demote(self, group: Hashable) -> None:
        """The group's held blocks to the cold end, the deepest coldest."""
        members = self._members.pop(group, {})
        for block in sorted(members, key=members.__getitem__):
            del self._group_of[block]
            if block in self._order:
                self._order.move_to_end(block, last=False)


class ForecastAdmission(Admission):
    """``cache`` storing only blocks whose next use is more likely than not within ``horizon`` (in the
    forecast's unit): for an exponential time to next use, an expectation under ``horizon / ln 2``."""

    def __init__(self, cache: Cache, stream: Stream, forecast: Forecast, horizon: float) -> None:
        super().__init__(cache, stream)
        self._forecast = forecast
        self._limit = horizon / math.log(2)

    def begin(self, request: int) -> None:
        self._forecast.advance(request)

    def admits(self, request: int, position: int) -> bool:
        return self._forecast.expected(self._forecast.group(request, position)) < self._limit


__all__ = [
    "NEVER_USED",
    "ExpectedBelady",
    "Forecast",
    "ForecastAdmission",
    "FutureForecast",
    "HintedLRU",
    "Knowledge",
    "PresentForecast",
]
