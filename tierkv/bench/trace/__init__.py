"""``tierkv bench trace``: how much each eviction policy keeps of what an agent platform needs again.

- :mod:`.model` — the JSONL trace format (requests as segments or token ids, plus their prompt layout)
  and its parser;
- :mod:`.generate` — the seeded multi-tenant agent trace (layered system prompts, memories, tool results,
  multi-turn history, pasted documents);
- :mod:`.replay` — replay through real vaults, one per capacity and policy, counting hits per class;
- :mod:`.report` — issue 11's targets against ``lru``, the tables and the hit-rate chart;
- :mod:`.run` — the command's whole run.
"""

from __future__ import annotations

from tierkv.bench.trace.generate import TraceSpec, generate
from tierkv.bench.trace.model import Request, Trace, TraceError, parse_lines, read_trace, write_trace

__all__ = [
    "Request",
    "Trace",
    "TraceError",
    "TraceSpec",
    "generate",
    "parse_lines",
    "read_trace",
    "write_trace",
]
