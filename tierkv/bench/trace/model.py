"""The trace format: requests as token sequences with a prompt layout, one JSON object per line.

A trace file (JSONL, UTF-8) holds an optional header line and then one request per line::

    {"format": "tierkv-trace", "version": 1, "generator": {...}}
    {"tenant": "t0", "agent": "t0/a1", "session": "t0/a1/s2",
     "segments": [["t0/axioms", 612], ["t0/a1/identity", 300], ["t0/a1/s2/u0", 48]],
     "layout": [{"tokens": [0, 612], "source": "axioms"}, {"tokens": [612, 912], "source": "identity"},
                {"tokens": [912, 960], "source": "user_turn"}]}

- ``tenant`` (required): requests of one tenant share a namespace, hence a prefix tree; tenants never
  share blocks. ``agent`` and ``session`` are labels (reports only).
- The tokens are either ``"tokens": [id, ...]`` (ints in 0..2**31-1) or ``"segments": [[id, length],
  ...]``: segment ``id`` (a string) expands to ``length`` token ids by :func:`segment_tokens`, the same on
  every machine and numpy version, so a trace of long prompts stays small and two requests that name the
  same segment at the same position share its blocks. A segment's first k tokens do not depend on its
  length.
- ``layout``: the prompt's chunks exactly as an application sends them to tierkv
  (:func:`tierkv.retention.parse_layout`, token spans only), each span inside the request.
- ``timestamp`` (optional): when the request arrived, in milliseconds from any origin (the file need
  not be sorted: where every request has one, the reader replays them in timestamp order).

Traces in the hash-id format of the public KV-reuse traces (:mod:`.hashids`) are read by the same
reader (:mod:`.reader`): a line with ``hash_ids`` is one of those. A malformed line is a
:class:`TraceError` naming the file, the line and the field, never a traceback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt

from tierkv.errors import BenchError
from tierkv.retention import Chunk, parse_layout

log = logging.getLogger(__name__)

FORMAT: Final = "tierkv-trace"
VERSION: Final = 1
VOCAB: Final = 151_936
"""Segment token ids fall in 0..VOCAB-1 (Qwen2.5's vocabulary size; only equality matters here)."""
MAX_TOKEN_ID: Final = 2**31 - 1
MAX_REQUEST_TOKENS: Final = 1 << 21
MAX_NAME_CHARS: Final = 256
_SEGMENT_TAG: Final = b"tierkv/trace-segment/v1\x00"
_GOLDEN: Final = np.uint64(0x9E3779B97F4A7C15)
_MIX1: Final = np.uint64(0xBF58476D1CE4E5B9)
_MIX2: Final = np.uint64(0x94D049BB133111EB)
_REQUEST_KEYS: Final = frozenset({"tenant", "agent", "session", "segments", "tokens", "layout", "timestamp"})


class TraceError(BenchError):
    """A trace line is malformed: the message names the file, the line and the field."""


def segment_tokens(segment_id: str, length: int) -> npt.NDArray[np.int64]:
    """``length`` token ids for segment ``segment_id``: splitmix64 of a counter seeded by the SHA-256 of
    the id (fixed arithmetic, so no dependence on numpy's random streams), reduced to the vocabulary."""
    seed = np.uint64(
        int.from_bytes(hashlib.sha256(_SEGMENT_TAG + segment_id.encode()).digest()[:8], "little")
    )
    x = np.arange(1, length + 1, dtype=np.uint64) * _GOLDEN + seed
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return (x % np.uint64(VOCAB)).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Request:
    """One prompt sent by a tenant's agent: its tokens (explicit, as segments, or as the chained ids of
    its blocks with its length) and its layout."""

    tenant: str
    layout: tuple[Mapping[str, Any], ...]
    segments: tuple[tuple[str, int], ...] = ()
    tokens: tuple[int, ...] | None = None
    agent: str = ""
    session: str = ""
    timestamp: float | None = None
    """Arrival time in milliseconds (None: the trace has none)."""
    hash_ids: tuple[int, ...] | None = None
    """The chained ids of the prompt's blocks (equal ids, equal prefix), for a hash-id trace."""
    length: int = 0
    """The prompt's tokens where only ``hash_ids`` stand for them."""

    @property
    def n_tokens(self) -> int:
        if self.hash_ids is not None:
            return self.length
        return len(self.tokens) if self.tokens is not None else sum(n for _, n in self.segments)

    def token_ids(self) -> npt.NDArray[np.int64]:
        if self.tokens is not None:
            return np.asarray(self.tokens, dtype=np.int64)
        if not self.segments:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([segment_tokens(s, n) for s, n in self.segments])

    def chunks(self) -> list[Chunk]:
        return parse_layout(list(self.layout))

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"tenant": self.tenant}
        if self.agent:
            doc["agent"] = self.agent
        if self.session:
            doc["session"] = self.session
        if self.timestamp is not None:
            doc["timestamp"] = self.timestamp
        if self.tokens is not None:
            doc["tokens"] = list(self.tokens)
        else:
            doc["segments"] = [[s, n] for s, n in self.segments]
        doc["layout"] = [dict(c) for c in self.layout]
        return doc


@dataclasses.dataclass(frozen=True)
class Trace:
    """Requests in the order they arrive, and what made them (the header's ``generator``, if any)."""

    requests: tuple[Request, ...]
    generator: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    source: str = "generated"
    block_tokens: int | None = None
    """Tokens per id of the hash-id requests (None: the trace has none)."""
    reading: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """What reading the file found and assumed (format, block size, time unit, order, ...)."""
    notes: tuple[str, ...] = ()
    """The same for a reader: what was assumed or left out, one sentence each."""


def _name(doc: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = doc.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise TraceError(f"{where}.{key}: expected a non-empty string of at most {MAX_NAME_CHARS} chars")
    return value


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _segments(value: object, where: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, list):
        raise TraceError(f"{where}.segments: expected a list of [id, length]")
    out: list[tuple[str, int]] = []
    total = 0
    for i, item in enumerate(value):
        ok = isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and _is_int(item[1])
        if not ok or not item[0] or len(item[0]) > MAX_NAME_CHARS or not 0 <= item[1] <= MAX_REQUEST_TOKENS:
            raise TraceError(
                f"{where}.segments[{i}]: expected [id, length] with a non-empty id of at most "
                f"{MAX_NAME_CHARS} chars and 0 <= length <= {MAX_REQUEST_TOKENS}, got {short(item)}"
            )
        total += item[1]
        out.append((item[0], item[1]))
    if total > MAX_REQUEST_TOKENS:
        raise TraceError(f"{where}.segments: {total} tokens, more than {MAX_REQUEST_TOKENS}")
    return tuple(out)


def _tokens(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_REQUEST_TOKENS:
        raise TraceError(f"{where}.tokens: expected a list of at most {MAX_REQUEST_TOKENS} token ids")
    for i, t in enumerate(value):
        if not _is_int(t) or not 0 <= t <= MAX_TOKEN_ID:
            raise TraceError(f"{where}.tokens[{i}]: expected an int in 0..{MAX_TOKEN_ID}, got {short(t)}")
    return tuple(value)


def _layout(value: object, n_tokens: int, where: str) -> tuple[Mapping[str, Any], ...]:
    try:
        chunks = parse_layout(value, where=f"{where}.layout")
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    for i, chunk in enumerate(chunks):
        if chunk.stop > n_tokens:
            raise TraceError(f"{where}.layout[{i}]: span ends at {chunk.stop}, past the {n_tokens} tokens")
    return tuple(cast("list[Mapping[str, Any]]", value))  # parse_layout checked every entry


def parse_request(doc: object, where: str) -> Request:
    """A :class:`Request` from one decoded line; :class:`TraceError` naming ``where`` and the field."""
    if not isinstance(doc, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    unknown = set(doc) - _REQUEST_KEYS
    if unknown:
        raise TraceError(f"{where}: unknown field(s) {sorted(unknown)}")
    if ("segments" in doc) == ("tokens" in doc):
        raise TraceError(f"{where}: give exactly one of 'segments' or 'tokens'")
    segments = _segments(doc["segments"], where) if "segments" in doc else ()
    tokens = _tokens(doc["tokens"], where) if "tokens" in doc else None
    n_tokens = len(tokens) if tokens is not None else sum(n for _, n in segments)
    return Request(
        timestamp=timestamp(doc, where),
        tenant=_name(doc, "tenant", where, required=True),
        agent=_name(doc, "agent", where),
        session=_name(doc, "session", where),
        segments=segments,
        tokens=tokens,
        layout=_layout(doc.get("layout", []), n_tokens, where),
    )


def timestamp(doc: Mapping[str, Any], where: str) -> float | None:
    """The optional ``timestamp`` (ms): a finite number >= 0."""
    value = doc.get("timestamp")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e15:
        raise TraceError(f"{where}.timestamp: expected milliseconds, a number >= 0, got {short(value)}")
    return float(value)


def short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def header(doc: object, where: str) -> Mapping[str, Any] | None:
    """The generator settings of a header line, or None when ``doc`` is a request."""
    if not isinstance(doc, dict) or "format" not in doc:
        return None
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise TraceError(f"{where}: expected format {FORMAT!r} version {VERSION}, got {short(doc)}")
    generator = doc.get("generator", {})
    if not isinstance(generator, dict):
        raise TraceError(f"{where}.generator: expected an object")
    return generator


def trace_lines(trace: Trace) -> Iterator[str]:
    """The header and one line per request, without newlines; a trace of hash-id requests is written in
    that format alone (no header), as other tools read it."""
    from tierkv.bench.trace import hashids  # it builds on this module's Request

    if all(r.hash_ids is not None for r in trace.requests):
        for request in trace.requests:
            yield json.dumps(hashids.hash_line(request), separators=(", ", ": "))
        return
    yield json.dumps({"format": FORMAT, "version": VERSION, "generator": dict(trace.generator)})
    for request in trace.requests:
        doc = request.to_json() if request.hash_ids is None else hashids.hash_line(request)
        yield json.dumps(doc, separators=(",", ":"))


def write_trace(trace: Trace, path: str | Path) -> Path:
    target = Path(path).expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w", encoding="utf-8") as fh:
            for line in trace_lines(trace):
                fh.write(line + "\n")
    except OSError as exc:
        raise TraceError(f"--write-trace {target}: {exc.strerror or exc}") from None
    return target


def summarize(requests: Sequence[Request]) -> dict[str, int]:
    """Counts of a trace, before any block is computed."""
    return {
        "requests": len(requests),
        "tenants": len({r.tenant for r in requests}),
        "agents": len({(r.tenant, r.agent) for r in requests}),
        "sessions": len({(r.tenant, r.session) for r in requests}),
        "prompt_tokens": sum(r.n_tokens for r in requests),
    }


__all__ = [
    "FORMAT",
    "MAX_REQUEST_TOKENS",
    "VERSION",
    "VOCAB",
    "Request",
    "Trace",
    "TraceError",
    "header",
    "parse_request",
    "segment_tokens",
    "short",
    "summarize",
    "trace_lines",
    "write_trace",
]
