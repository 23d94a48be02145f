"""Hash-id traces: the format of Mooncake's FAST'25 trace release (also read by Dynamo's trace tools).

One JSON object per line, one request each::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353, 2354]}

``hash_ids`` are the chained ids of the prompt's blocks of ``block_tokens`` tokens (512 in the public
traces): two requests with equal ids at a position share every token up to the end of that block, so the
ids stand for the tokens and the replay keys blocks by them. The last id may cover a partial block (an
engine stores full blocks only). ``timestamp`` is in milliseconds; ``output_length`` is read and checked
but a prompt cache has no use for it. ``tenant`` (optional, a tierkv extension) puts the request in that
tenant's namespace; without it every request is the ``default`` tenant's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from tierkv.bench.trace.model import MAX_REQUEST_TOKENS, Request, TraceError, timestamp

DEFAULT_BLOCK_TOKENS: Final = 512
"""The block size of the public Mooncake traces."""
DEFAULT_TENANT: Final = "default"
MAX_HASH_ID: Final = 2**63 - 1
_KEYS: Final = frozenset({"timestamp", "input_length", "output_length", "hash_ids", "tenant"})


def is_hash_request(doc: object) -> bool:
    """A decoded line in the hash-id format (it has ``hash_ids``)."""
    return isinstance(doc, dict) and "hash_ids" in doc


def _count(doc: Mapping[str, Any], key: str, where: str, *, required: bool) -> int:
    value = doc.get(key)
    if value is None and not required:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REQUEST_TOKENS:
        raise TraceError(f"{where}.{key}: expected a token count in 0..{MAX_REQUEST_TOKENS}, got {value!r}")
    return value


def _ids(value: object, length: int, block_tokens: int, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TraceError(f"{where}.hash_ids: expected a list of integers")
    for i, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_HASH_ID:
            raise TraceError(f"{where}.hash_ids[{i}]: expected an int in 0..{MAX_HASH_ID}, got {x!r}")
    full, covered = length // block_tokens, -(-length // block_tokens)
    if not full <= len(value) <= covered:
        need = str(full) if full == covered else f"{full} or {covered}"
        raise TraceError(
            f"{where}.hash_ids: {len(value)} ids for input_length {length} in blocks of {block_tokens} "
            f"tokens (expected {need}; is the trace's block size {block_tokens}?)"
        )
    return tuple(value)


def parse_hash_request(doc: Mapping[str, Any], where: str, block_tokens: int) -> Request:
    """A :class:`Request` from one hash-id line; :class:`TraceError` naming ``where`` and the field."""
    unknown = set(doc) - _KEYS
    if unknown:
        raise TraceError(f"{where}: unknown field(s) {sorted(unknown)} in a hash-id request")
    length = _count(doc, "input_length", where, required=True)
    _count(doc, "output_length", where, required=False)
    tenant = doc.get("tenant", DEFAULT_TENANT)
    if not isinstance(tenant, str) or not tenant or len(tenant) > 256:
        raise TraceError(f"{where}.tenant: expected a non-empty string of at most 256 chars")
    return Request(
        tenant=tenant,
        layout=(),
        timestamp=timestamp(doc, where),
        hash_ids=_ids(doc["hash_ids"], length, block_tokens, where),
        length=length,
    )


def hash_line(request: Request) -> dict[str, Any]:
    """The hash-id line of a request that has ``hash_ids``."""
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
    "hash_line",
    "is_hash_request",
    "parse_hash_request",
]
