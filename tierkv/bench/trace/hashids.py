"""Hash-id traces: one JSON object per request whose prompt is given as the ids of its token blocks.

The public KV-reuse traces all have this shape::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353, 2354]}

- Mooncake's (FAST'25 ``conversation_trace.jsonl``, ``toolagent_trace.jsonl``, ``synthetic_trace.jsonl``,
  and the older ``arxiv-trace/mooncake_trace.jsonl``): ``timestamp`` in milliseconds, blocks of 512 tokens.
- Alibaba's Qwen/Bailian traces (``qwen_*_blksz_16.jsonl``, "KVCache Cache in the Wild", ATC'25): also
  ``chat_id``, ``parent_chat_id`` (-1 for a conversation's first request), ``type`` (text, search, image,
  file) and ``turn``; ``timestamp`` in *seconds* (a float); blocks of 16 tokens.
- aiperf's and Dynamo's mooncake-style traces: the Mooncake fields, a ``timestamp`` that may be a float
  (milliseconds), and optionally ``session_id``, ``delay`` (milliseconds after the session's previous
  turn, not an arrival time), ``extra``, ``priority``, ``agent_type``; ids may be unsigned 64-bit.

``hash_ids`` are ids of the prompt's blocks such that equal ids at a position mean an equal prompt up to
the end of that block (the traces remap chained block hashes to small integers); the last id may cover a
partial block (an engine stores full blocks only). The block size is found from the lines
(:mod:`.blocksize`) unless given. ``output_length`` is checked but a prompt cache has no use for it.
``tenant`` (optional, a tierkv extension) puts the request in that tenant's namespace; without it every
request is the ``default`` tenant's. Fields not named here are ignored, and the reader says which.

Lines that give a prompt only as a token count (``input_length`` without ``hash_ids``, as Azure's and
BurstGPT's traces do) or as text (aiperf's ``text_input``, ``messages``, ``payload``) say nothing about
what it shares with earlier prompts: they are refused with that reason, not replayed as if unique.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from tierkv.bench.trace.model import MAX_REQUEST_TOKENS, Request, TraceError, short

DEFAULT_BLOCK_TOKENS: Final = 512
"""The block size of Mooncake's public traces."""
DEFAULT_TENANT: Final = "default"
MIN_HASH_ID: Final = -(2**63)
MAX_HASH_ID: Final = 2**64 - 1
"""Ids are 64-bit, signed or not (Dynamo writes unsigned ones)."""
MAX_TIMESTAMP_MS: Final = 1e15
BAILIAN_FIELDS: Final = frozenset({"chat_id", "parent_chat_id", "type", "turn"})
KNOWN_FIELDS: Final = frozenset(
    {"timestamp", "input_length", "output_length", "hash_ids", "tenant"}
    | BAILIAN_FIELDS
    | {"session_id", "delay", "extra", "priority", "agent_type"}
)
"""Fields of the public hash-id traces; any other field is ignored and named in the reader's notes."""
_TEXT_FIELDS: Final = ("text_input", "messages", "payload")
TIME_UNITS: Final = {"ms": 1.0, "s": 1000.0}
"""Milliseconds per unit of ``timestamp``."""


def is_hash_request(doc: object) -> bool:
    """A decoded line in the hash-id format (it has ``hash_ids``)."""
    return isinstance(doc, dict) and "hash_ids" in doc


def without_prefix_identity(doc: Mapping[str, Any], where: str) -> TraceError | None:
    """The refusal for a request given only as a token count or as text (no ids to compare prompts by),
    or None when ``doc`` is not one."""
    text = next((f for f in _TEXT_FIELDS if f in doc), None)
    if text is not None:
        return TraceError(
            f"{where}.{text}: a prompt given as text, without hash_ids: tierkv does not tokenize, so it "
            "cannot tell what the prompt shares with earlier ones; give hash_ids (blocks of the trace's "
            "size) or token ids in tierkv's format"
        )
    if "input_length" in doc:
        return TraceError(
            f"{where}.hash_ids: missing: a request of token counts only (input_length) says nothing about "
            "what its prompt shares with earlier ones, so its reuse cannot be replayed (traces of counts "
            "alone, such as Azure's or BurstGPT's, cannot measure a cache)"
        )
    return None


def time_unit(doc: Mapping[str, Any]) -> str:
    """The unit of a hash-id line's ``timestamp``: seconds for Bailian's (its ``chat_id`` and
    ``parent_chat_id`` tell it), milliseconds for the others."""
    return "s" if "chat_id" in doc and "parent_chat_id" in doc else "ms"


def _count(doc: Mapping[str, Any], key: str, where: str, *, required: bool) -> int:
    value = doc.get(key)
    if value is None and not required:
        return 0
    if type(value) is not int or not 0 <= value <= MAX_REQUEST_TOKENS:
        raise TraceError(
            f"{where}.{key}: expected a token count in 0..{MAX_REQUEST_TOKENS}, got {short(value)}"
        )
    return value


def _ids(value: object, where: str) -> tuple[int, ...]:
    """The ids as a tuple; the common case (every one an int in range) checked without a Python loop."""
    if not isinstance(value, list):
        raise TraceError(f"{where}.hash_ids: expected a list of integers, got {short(value)}")
    ints = all(type(x) is int for x in value)
    if ints and (not value or (min(value) >= MIN_HASH_ID and max(value) <= MAX_HASH_ID)):
        return tuple(value)
    for i, x in enumerate(value):
        if type(x) is not int or not MIN_HASH_ID <= x <= MAX_HASH_ID:
            hint = " (string ids: map them to integers first)" if isinstance(x, str) else ""
            raise TraceError(f"{where}.hash_ids[{i}]: expected a 64-bit integer id, got {short(x)}{hint}")
    raise AssertionError("unreachable: a bad id was found above")  # pragma: no cover


def _timestamp(doc: Mapping[str, Any], where: str, ms_per_unit: float) -> float | None:
    value = doc.get("timestamp")
    if value is None:
        return None
    unit = "seconds" if ms_per_unit != 1.0 else "milliseconds"
    if type(value) not in (int, float) or not 0 <= value < MAX_TIMESTAMP_MS / ms_per_unit:  # NaN fails too
        raise TraceError(f"{where}.timestamp: expected {unit}, a number >= 0, got {short(value)}")
    return float(value) * ms_per_unit


def _session(doc: Mapping[str, Any]) -> str:
    """aiperf's and Dynamo's ``session_id`` as the request's session label (reports only)."""
    value = doc.get("session_id")
    return str(value)[:256] if isinstance(value, str | int) and not isinstance(value, bool) else ""


def parse_hash_request(doc: Mapping[str, Any], where: str, ms_per_unit: float = 1.0) -> Request:
    """A :class:`Request` from one hash-id line (``timestamp`` in units of ``ms_per_unit`` milliseconds);
    :class:`TraceError` naming ``where`` and the field. The id count is checked against the block size by
    the reader (:class:`~tierkv.bench.trace.blocksize.BlockSize`)."""
    length = _count(doc, "input_length", where, required=True)
    _count(doc, "output_length", where, required=False)
    tenant = doc.get("tenant", DEFAULT_TENANT)
    if not isinstance(tenant, str) or not tenant or len(tenant) > 256:
        raise TraceError(f"{where}.tenant: expected a non-empty string of at most 256 chars")
    return Request(
        tenant=tenant,
        layout=(),
        session=_session(doc),
        timestamp=_timestamp(doc, where, ms_per_unit),
        hash_ids=_ids(doc["hash_ids"], where),
        length=length,
    )


def hash_line(request: Request) -> dict[str, Any]:
    """The hash-id line of a request that has ``hash_ids`` (timestamps in milliseconds)."""
    if request.hash_ids is None:
        raise ValueError("not a hash-id request")
    doc: dict[str, Any] = {}
    if request.timestamp is not None:
        doc["timestamp"] = round(request.timestamp)
    doc |= {"input_length": request.length, "hash_ids": list(request.hash_ids)}
    if request.tenant != DEFAULT_TENANT:
        doc["tenant"] = request.tenant
    return doc


__all__ = [
    "DEFAULT_BLOCK_TOKENS",
    "DEFAULT_TENANT",
    "KNOWN_FIELDS",
    "TIME_UNITS",
    "hash_line",
    "is_hash_request",
    "parse_hash_request",
    "time_unit",
    "without_prefix_identity",
]
