"""Seeded hash-id traces of multi-turn traffic, so policies are judged on more than one public trace.

Three shapes, each an event simulation with timestamps (sessions arrive as a Poisson process; a session's
next request comes after a think time), written in the hash-id format (:mod:`.hashids`):

- ``chat``: assistants with a shared system prompt each (popularity Zipf-like); a conversation resends its
  history every turn; the number of turns is heavy-tailed (most conversations are one or two turns, a few
  run long); users think for a minute or so between turns.
- ``docs``: questions about documents (4k–32k tokens) from a corpus whose popularity is Zipf-like; a
  session asks one to five independent questions about one document, minutes apart; many documents are
  asked about once.
- ``agents``: tool-using agents with long tool-description prefixes; a task is 3–20 steps of tool output
  and model action in quick succession (seconds), each step resending the whole task so far.

Prompts are built from parts (system prompt, document, turns); a block's id is the chain of everything up
to its end, numbered from 0 in order of first appearance, as the public traces number theirs.

``observe`` (optional) is told, after every request, the state of the session that made it
(:class:`SessionState`): what a policy knowing the workload's present, but not its future draws, would
know. It draws nothing, so a trace is the same with or without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import math
import random
from collections.abc import Callable
from typing import Final

from tierkv.bench.trace.hashids import DEFAULT_BLOCK_TOKENS, DEFAULT_TENANT
from tierkv.bench.trace.model import Request, Trace, TraceError

SHAPES: Final = ("chat", "docs", "agents")
ARRIVALS_PER_S: Final = {"chat": 1.5, "docs": 0.5, "agents": 0.3}
"""New sessions per second, per shape."""
Part = tuple[str, int]
"""A named run of tokens: (id, length)."""


@dataclasses.dataclass(frozen=True)
class ConversationSpec:
    shape: str = "chat"
    seed: int = 0
    requests: int = 4000
    block_tokens: int = DEFAULT_BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise TraceError(f"--workload: expected one of {', '.join(SHAPES)}, got {self.shape!r}")
        if self.requests < 1 or self.block_tokens < 1:
            raise TraceError("--requests and --block-tokens must be at least 1")


class _Blocks:
    """Chained block ids of prompts made of parts, numbered in order of first appearance."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.ids: dict[bytes, int] = {}

    def of(self, parts: list[Part]) -> tuple[tuple[int, ...], int]:
        """(ids of every block, the last maybe partial, as in the public traces; total tokens)."""
        out: list[int] = []
        chain = hashlib.sha256()
        total = sum(n for _, n in parts)
        at = 0
        for name, n in parts:
            start = at
            at += n
            while start < at:
                stop = min(at, (len(out) + 1) * self.block_tokens)
                chain.update(f"{name}:{start}:{stop};".encode())
                start = stop
                if stop % self.block_tokens == 0 or stop == total:
                    out.append(self.ids.setdefault(chain.copy().digest(), len(self.ids)))
        return tuple(out), at


def _lognormal(rng: random.Random, median: float, lo: int, hi: int, sigma: float = 0.8) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


def _zipf_weights(n: int, alpha: float) -> list[float]:
    return [1.0 / (k + 1) ** alpha for k in range(n)]


def _zipf(rng: random.Random, n: int, alpha: float = 1.0) -> int:
    return rng.choices(range(n), _zipf_weights(n, alpha))[0]


def _zipf_share(k: int, n: int, alpha: float = 1.0) -> float:
    """The probability that :func:`_zipf` draws ``k``."""
    weights = _zipf_weights(n, alpha)
    return weights[k] / sum(weights)


@dataclasses.dataclass
class _Session:
    """A session's prompt so far and what it does next (``step`` returns the next prompt, None: done)."""

    name: str
    prefix: list[Part]
    history: list[Part] = dataclasses.field(default_factory=list)
    left: int = 1
    think_s: float = 60.0
    shared: tuple[float, ...] = ()
    """Per leading part of ``prefix`` that other sessions may share: the share of new sessions whose
    prompts start with the parts up to it."""
    carries_turns: bool = True
    """Whether the next prompt resends this one whole (else only ``prefix``)."""


def _chat(rng: random.Random, n: int) -> _Session:
    app = _zipf(rng, 12)
    system = (f"chat-app{app}", 300 + 250 * app)
    turns = min(40, int(rng.paretovariate(1.3)) + (rng.random() < 0.45))
    think_s = rng.expovariate(1 / 60)
    return _Session(f"chat{n}", [system], left=turns, think_s=think_s, shared=(_zipf_share(app, 12),))


def _docs(rng: random.Random, n: int) -> _Session:
    doc = _zipf(rng, 400, 0.9)
    pages = (f"doc{doc}", 4096 + (doc * 7919) % 28672)
    prefix = [("docs-system", 700), pages]
    shared = (1.0, _zipf_share(doc, 400, 0.9))
    return _Session(
        f"docs{n}", prefix, left=rng.randint(1, 5), think_s=180.0, shared=shared, carries_turns=False
    )


def _agents(rng: random.Random, n: int) -> _Session:
    app = _zipf(rng, 6)
    tools = (f"agent-app{app}", 2000 + 800 * app)
    task = (f"agent{n}/task", _lognormal(rng, 300, 30, 3000))
    shared = (_zipf_share(app, 6),)
    return _Session(f"agents{n}", [tools, task], left=rng.randint(3, 20), think_s=3.0, shared=shared)


_START: Final[dict[str, Callable[[random.Random, int], _Session]]] = {
    "chat": _chat,
    "docs": _docs,
    "agents": _agents,
}


def _turn(shape: str, session: _Session, rng: random.Random, turn: int) -> list[Part]:
    """The new parts of the session's next prompt (and, for multi-turn shapes, the reply joins later)."""
    name = f"{session.name}/{turn}"
    if shape == "chat":
        return [(f"{name}/user", _lognormal(rng, 120, 8, 4000, 1.1))]
    if shape == "docs":
        return [(f"{name}/question", _lognormal(rng, 60, 8, 600))]
    return [(f"{name}/tool", _lognormal(rng, 400, 20, 6000, 1.0))]


def _reply(shape: str, session: _Session, rng: random.Random, turn: int) -> list[Part]:
    if shape == "docs":
        return []  # every question is asked against the document alone
    median = 250 if shape == "chat" else 80
    return [(f"{session.name}/{turn}/reply", _lognormal(rng, median, 10, 2000))]


@dataclasses.dataclass(frozen=True)
class SharedPrefix:
    """Leading parts of a prompt that other sessions' prompts may start with too (a system prompt, a
    tool description, a document)."""

    parts: tuple[str, ...]
    tokens: int
    share: float
    """The probability that a new session's prompts start with these parts."""


@dataclasses.dataclass(frozen=True)
class SessionState:
    """A session just after one of its requests: what is knowable about it without its future draws."""

    session: int
    turn: int
    """The request's turn in its session, from 0."""
    left: int
    """Requests the session will still make."""
    think_s: float
    """The mean of its (exponential, so memoryless) wait before each of them, in seconds."""
    carried: int
    """Tokens at the start of this prompt that each of its later prompts resends."""
    shared: tuple[SharedPrefix, ...]
    """Its prompt's shareable leading parts, shortest first."""
    arrival_rate: float
    """New sessions per second (a Poisson process)."""
    clock_s: float


def _state(session: _Session, sid: int, turn: int, length: int, rate: float, clock: float) -> SessionState:
    shared: list[SharedPrefix] = []
    for k, share in enumerate(session.shared, 1):
        parts = session.prefix[:k]
        shared.append(SharedPrefix(tuple(name for name, _ in parts), sum(n for _, n in parts), share))
    carried = length if session.carries_turns else sum(n for _, n in session.prefix)
    return SessionState(sid, turn, session.left, session.think_s, carried, tuple(shared), rate, clock)


def generate_conversations(
    spec: ConversationSpec, observe: Callable[[SessionState], None] | None = None
) -> Trace:
    """``spec.requests`` requests of ``spec.shape`` traffic (same spec, same trace); ``observe`` is told
    each request's :class:`SessionState` in order."""
    rng = random.Random(f"{spec.shape}/{spec.seed}")
    blocks = _Blocks(spec.block_tokens)
    start = _START[spec.shape]
    rate = ARRIVALS_PER_S[spec.shape]
    events: list[tuple[float, int, int]] = []
    sessions: dict[int, _Session] = {}
    turns: dict[int, int] = {}
    clock, made, started = 0.0, 0, 0
    requests: list[Request] = []
    while len(requests) < spec.requests:
        arrival = clock + rng.expovariate(rate)
        if not events or arrival < events[0][0]:
            clock = arrival
            sessions[started], turns[started] = start(rng, started), 0
            heapq.heappush(events, (clock, made, started))
            started += 1
            made += 1
            continue
        clock, _, sid = heapq.heappop(events)
        session, turn = sessions[sid], turns[sid]
        new = _turn(spec.shape, session, rng, turn)
        ids, length = blocks.of([*session.prefix, *session.history, *new])
        requests.append(
            Request(DEFAULT_TENANT, (), timestamp=round(clock * 1000), hash_ids=ids, length=length)
        )
        if spec.shape != "docs":
            session.history += [*new, *_reply(spec.shape, session, rng, turn)]
        session.left -= 1
        turns[sid] = turn + 1
        if observe is not None:
            observe(_state(session, sid, turn, length, rate, clock))
        if session.left > 0:
            heapq.heappush(events, (clock + rng.expovariate(1 / session.think_s), made, sid))
            made += 1
        else:
            del sessions[sid]
    generator = {"name": "tierkv.bench.trace.conversations", **dataclasses.asdict(spec)}
    return Trace(tuple(requests), generator, f"generated {spec.shape} (seed {spec.seed})", spec.block_tokens)


__all__ = [
    "ARRIVALS_PER_S",
    "SHAPES",
    "ConversationSpec",
    "SessionState",
    "SharedPrefix",
    "generate_conversations",
]
