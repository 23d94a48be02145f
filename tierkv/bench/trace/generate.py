"""A seeded multi-tenant agent trace: what an agent platform sends a KV cache, request by request.

The shape of the traffic, and why each part is there:

- **Tenants** each have their own namespace. A tenant's **axioms** (128–1024 tokens) are shared by all
  its agents; each **agent** adds its **identity** (128–1024) and **rules** (256–2048), so a system
  prompt is 0.5–4k tokens, identical across that agent's sessions and sent first in every request.
- **Recalled memories** (64–256 tokens each, the agent's latest ``memories_recalled``) follow the system
  prompt. Before a session starts the agent may learn a new memory (``new_memory_p``), so consecutive
  sessions share this part of the prefix until it changes.
- A **session** is a conversation of up to ``turns`` inputs; every input is one request that resends the
  whole history: previous prompt + the reply (``generation``, 32–384 tokens) + the new input. An input is
  a **user turn** (16–256 tokens), sometimes with a **pasted document** (``doc_p``, 2–8k tokens, source
  ``context``: the one long document that pushes everyone else's system prompt out of an LRU cache), or
  a **tool result** (``tool_p``, 128–1024 tokens): half from the agent's persistent knowledge base
  (source ``tools``, persistent), half fresh one-off output (``tools`` with ``ephemeral`` durability and
  importance 0.3).
- **Interleaving**: ``concurrency`` sessions are in flight at once (tenants and agents mixed) and each
  request comes from one of them at random; a finished session comes back later with one more user turn
  (``resume_p``) that asks again about what it discussed (tool results included), after other
  tenants' traffic went through the cache.

Every part is a segment (:func:`tierkv.bench.trace.model.segment_tokens`), so the same seed and settings
give the same trace, and ``--write-trace`` saves it as JSONL for replay anywhere (Python's ``random``
drives the choices).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from tierkv.bench.trace.model import Request, Trace, TraceError

Span = tuple[int, int]
Part = tuple[str, int, Mapping[str, Any]]
"""A segment of a prompt: (segment id, tokens, its layout chunk without the span)."""

EPHEMERAL_TOOL: Mapping[str, Any] = {"source": "tools", "durability": "ephemeral", "importance": 0.3}


@dataclasses.dataclass(frozen=True)
class TraceSpec:
    """Settings of the generator (ranges are inclusive token counts)."""

    seed: int = 0
    tenants: int = 2
    agents: int = 2
    sessions: int = 8
    turns: int = 6
    concurrency: int = 4
    axioms_tokens: Span = (128, 1024)
    identity_tokens: Span = (128, 1024)
    rules_tokens: Span = (256, 2048)
    memory_tokens: Span = (64, 256)
    memories_recalled: int = 3
    new_memory_p: float = 0.4
    user_tokens: Span = (16, 256)
    reply_tokens: Span = (32, 384)
    tool_p: float = 0.35
    tool_tokens: Span = (128, 1024)
    knowledge_base: int = 4
    persistent_tool_p: float = 0.5
    doc_p: float = 0.12
    doc_tokens: Span = (2048, 8192)
    resume_p: float = 0.3

    def __post_init__(self) -> None:
        counts = {"--tenants": self.tenants, "--agents": self.agents, "--sessions": self.sessions}
        counts |= {
            "--turns": self.turns,
            "concurrency": self.concurrency,
            "knowledge_base": self.knowledge_base,
        }
        bad = [name for name, value in counts.items() if value < 1]
        if bad:
            raise TraceError(f"{', '.join(bad)} must be at least 1")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_p") and not 0.0 <= value <= 1.0:
                raise TraceError(f"{f.name} must be a probability, got {value}")
            if f.name.endswith("_tokens") and not 0 < value[0] <= value[1]:
                raise TraceError(f"{f.name} must be a range 0 < lo <= hi, got {value}")


class _Agent:
    """An agent's system prompt, its memories and its knowledge base (segments shared by its sessions)."""

    def __init__(self, tenant: str, name: str, axioms: Part, spec: TraceSpec, rng: random.Random) -> None:
        self.tenant, self.name, self.spec, self.rng = tenant, name, spec, rng
        self.system: list[Part] = [
            axioms,
            _part(f"{name}/identity", spec.identity_tokens, rng, source="identity"),
            _part(f"{name}/rules", spec.rules_tokens, rng, source="rules"),
        ]
        self.memories: list[Part] = []
        self.kb = [
            _part(f"{name}/kb{k}", spec.tool_tokens, rng, source="tools") for k in range(spec.knowledge_base)
        ]
        self.started = 0

    def new_session(self) -> _Session:
        """The next session, after maybe learning a memory; it recalls the latest ones."""
        if not self.memories or self.rng.random() < self.spec.new_memory_p:
            k = len(self.memories)
            self.memories.append(
                _part(f"{self.name}/memory{k}", self.spec.memory_tokens, self.rng, "memories")
            )
        name = f"{self.name}/s{self.started}"
        self.started += 1
        inputs = self.rng.randint(1, self.spec.turns)
        return _Session(self, name, [*self.system, *self.memories[-self.spec.memories_recalled :]], inputs)


class _Session:
    """One conversation: a fixed prefix, the history so far, and how many inputs are still to come."""

    def __init__(self, agent: _Agent, name: str, prefix: list[Part], inputs: int) -> None:
        self.agent, self.name, self.prefix, self.left = agent, name, prefix, inputs
        self.history: list[Part] = []
        self.turn = 0
        self.resumed = False

    def next_request(self) -> Request:
        """The prompt of the next input (history resent), then the reply joins the history."""
        new = self._input()
        parts = [*self.prefix, *self.history, *new]
        spec, rng = self.agent.spec, self.agent.rng
        reply = _part(f"{self.name}/reply{self.turn}", spec.reply_tokens, rng, source="generation")
        self.history.extend([*new, reply])
        self.turn += 1
        self.left -= 1
        return _request(self.agent, self.name, parts)

    def _input(self) -> list[Part]:
        spec, rng, t = self.agent.spec, self.agent.rng, self.turn
        if self.history and not self.resumed and rng.random() < spec.tool_p:
            if rng.random() < spec.persistent_tool_p:
                return [rng.choice(self.agent.kb)]
            return [_part(f"{self.name}/tool{t}", spec.tool_tokens, rng, **EPHEMERAL_TOOL)]
        new = [_part(f"{self.name}/user{t}", spec.user_tokens, rng, source="user_turn")]
        if not self.resumed and rng.random() < spec.doc_p:
            new.append(_part(f"{self.name}/doc{t}", spec.doc_tokens, rng, source="context"))
        return new


def _part(segment: str, span: Span, rng: random.Random, source: str, **extra: Any) -> Part:
    return (segment, rng.randint(*span), {"source": source, **extra})


def _request(agent: _Agent, session: str, parts: list[Part]) -> Request:
    layout: list[Mapping[str, Any]] = []
    at = 0
    for _, n, chunk in parts:
        layout.append({"tokens": [at, at + n], **chunk})
        at += n
    return Request(
        tenant=agent.tenant,
        agent=agent.name,
        session=session,
        segments=tuple((s, n) for s, n, _ in parts),
        layout=tuple(layout),
    )


def _agents(spec: TraceSpec, rng: random.Random) -> list[_Agent]:
    agents: list[_Agent] = []
    for t in range(spec.tenants):
        tenant = f"t{t}"
        axioms = _part(f"{tenant}/axioms", spec.axioms_tokens, rng, source="axioms")
        agents.extend(_Agent(tenant, f"{tenant}/a{a}", axioms, spec, rng) for a in range(spec.agents))
    return agents


def generate(spec: TraceSpec) -> Trace:
    """The trace ``spec`` describes (same spec, same trace)."""
    rng = random.Random(spec.seed)
    agents = _agents(spec, rng)
    order = [a for a in agents for _ in range(spec.sessions)]
    rng.shuffle(order)
    pending: list[_Agent | _Session] = list(order)
    active: list[_Session] = []
    requests: list[Request] = []
    while pending or active:
        while len(active) < spec.concurrency and pending:
            nxt = pending.pop(0)
            active.append(nxt.new_session() if isinstance(nxt, _Agent) else nxt)
        session = rng.choice(active)
        requests.append(session.next_request())
        if session.left > 0:
            continue
        active.remove(session)
        if not session.resumed and rng.random() < spec.resume_p:
            session.resumed, session.left = True, 1
            pending.insert(rng.randint(0, len(pending)), session)
    generator = {"name": "tierkv.bench.trace", **dataclasses.asdict(spec)}
    return Trace(tuple(requests), generator, f"generated (seed {spec.seed})")


__all__ = ["TraceSpec", "generate"]
