"""``tierkv bench trace``: how much each eviction policy keeps of what real traffic needs again.

- :mod:`.model` — the JSONL trace format (requests as segments or token ids, plus their prompt layout)
  and its parser;
- :mod:`.hashids` — hash-id traces (Mooncake's, Alibaba's Bailian traces, aiperf's and Dynamo's), read
  natively; :mod:`.blocksize` finds their block size from their lines;
- :mod:`.reader` — reading a trace file (gzip, byte-order mark, CRLF, order, a cap on requests), and the
  refusal of what cannot be replayed;
- :mod:`.generate` — the seeded multi-tenant agent trace (layered system prompts, memories, tool results,
  multi-turn history, pasted documents);
- :mod:`.conversations` — seeded hash-id traces of chat, document and agent traffic, with timestamps;
- :mod:`.replay` — replay through real vaults as an engine talks to them, one per capacity and policy,
  counting hits per class;
- :mod:`.simulate` — the same at block level in process: the reference LRU, the offline optimum, the
  ``adaptive`` policy's twin;
- :mod:`.reference` — the references beside every run and the share of the LRU → optimum gap closed;
- :mod:`.report` — the targets against ``lru``, the tables and the hit-rate chart;
- :mod:`.run` — the command's whole run.
"""

from __future__ import annotations

from tierkv.bench.trace.generate import TraceSpec, generate
from tierkv.bench.trace.model import Request, Trace, TraceError, write_trace
from tierkv.bench.trace.reader import ReadOptions, parse_lines, read_trace

__all__ = [
    "ReadOptions",
    "Request",
    "Trace",
    "TraceError",
    "TraceSpec",
    "generate",
    "parse_lines",
    "read_trace",
    "write_trace",
]
