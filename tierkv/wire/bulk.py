"""tierkv-bulk/1: the raw-TCP data plane that carries BatchGet and Put beside gRPC.

gRPC Python spends most of a large call in its own per-message work (on 2 cores it tops out near
1.5 GB/s for BatchGet, below Redis and well below the ~2.5 GB/s a plain socket reaches, and it held Put to
0.8–0.95 GB/s on a RAM disk where the store alone writes 1.2–2 GB/s). The vault therefore also listens on a
bulk port (advertised in ``StatsReply.bulk_port``; ``StatsReply.bulk_put`` says it takes Put too) where
the same ``Frame`` messages travel with scatter-gather ``sendmsg``: out of LMDB's memory map for BatchGet,
out of the caller's blobs for Put. gRPC keeps everything else: control calls, health, TLS; with TLS
configured the bulk port is off and both stay on gRPC. PrefixLookup, asked once for every request an
engine schedules, is answered there too (``StatsReply.bulk_lookup``): 0.24–0.31 ms a lookup against
0.81–0.83 ms over gRPC, from Python on loopback.

Request (client → vault)::

    b"TKVB" | u8 version (1) | u8 op | u32 token length | token | body

    op 1, BatchGet:     body = u32 length | BatchGetRequest
    op 2, Put:          body = records FRAME* END, each FRAME one Put frame exactly as gRPC would stream it
    op 3, PrefixLookup: body = u32 length | PrefixLookupRequest

Records are ``u8 kind | u32 length | payload`` both ways. Reply (vault → client): kind FRAME carries one
``tierkv.v1.Frame`` of a BatchGet reply, or the one serialized ``PutReply`` of a Put or
``PrefixLookupReply`` of a lookup; END (length 0)
closes a complete reply — the connection then takes the next request —; ERROR carries ``"STATUS_NAME
details"`` in UTF-8 and the vault closes the connection. This module does no I/O; everything it cannot
parse is a :class:`FrameError`.
"""

from __future__ import annotations

import struct

from tierkv.limits import MAX_AUTH_TOKEN_BYTES, MAX_BULK_REQUEST_BYTES, MAX_MESSAGE_BYTES
from tierkv.wire.framing import Buffer, FrameError

MAGIC = b"TKVB"
VERSION = 1
OP_BATCH_GET = 1
OP_PUT = 2
OP_PREFIX_LOOKUP = 3
OPS = (OP_BATCH_GET, OP_PUT, OP_PREFIX_LOOKUP)
FRAME, END, ERROR = 1, 2, 3
REQUEST_HEAD = struct.Struct("<4sBBI")
LENGTH = struct.Struct("<I")
RECORD = struct.Struct("<BI")
MAX_TOKEN_BYTES = MAX_AUTH_TOKEN_BYTES
MAX_REQUEST_BYTES = MAX_BULK_REQUEST_BYTES
MAX_ERROR_BYTES = 64 * 1024
_RECORD_LIMITS = {FRAME: MAX_MESSAGE_BYTES, END: 0, ERROR: MAX_ERROR_BYTES}
"""The longest payload each record kind may declare: a FRAME is at most a gRPC message, END is empty."""
_REQUEST_RECORD_LIMITS = {FRAME: MAX_MESSAGE_BYTES, END: 0}
"""A Put request is frames and an END; a client has no ERROR to send."""


class BulkProtocolError(FrameError):
    """The peer sent something that is not tierkv-bulk/1."""


def request_head(token: str | None, op: int) -> bytes:
    """The fixed head and the token of a request (a Put's records follow it)."""
    secret = (token or "").encode()
    return REQUEST_HEAD.pack(MAGIC, VERSION, op, len(secret)) + secret


def encode_request(token: str | None, request: bytes, op: int = OP_BATCH_GET) -> bytes:
    """A whole BatchGet (or PrefixLookup) request."""
    return b"".join([request_head(token, op), LENGTH.pack(len(request)), request])


def parse_request_head(head: Buffer) -> tuple[int, int]:
    """Validate the fixed head; returns the operation and the token length that follows."""
    if len(head) != REQUEST_HEAD.size:
        raise BulkProtocolError(f"a request head is {REQUEST_HEAD.size} bytes, got {len(head)}")
    magic, version, op, token_len = REQUEST_HEAD.unpack(head)
    if magic != MAGIC:
        raise BulkProtocolError("not a tierkv-bulk request")
    if version != VERSION or op not in OPS:
        raise BulkProtocolError(f"unsupported bulk version {version} or operation {op}")
    if token_len > MAX_TOKEN_BYTES:
        raise BulkProtocolError("token too long")
    return int(op), int(token_len)


def record(kind: int, length: int) -> bytes:
    return RECORD.pack(kind, length)


def parse_record(head: Buffer) -> tuple[int, int]:
    """Kind and payload length of one reply record; anything the vault never sends is refused here, so a
    reader never allocates what a garbled length claims."""
    return _parse_record(head, _RECORD_LIMITS, "reply")


def parse_request_record(head: Buffer) -> tuple[int, int]:
    """Kind and payload length of one record of a Put request (FRAME or END only)."""
    return _parse_record(head, _REQUEST_RECORD_LIMITS, "request")


def _parse_record(head: Buffer, limits: dict[int, int], what: str) -> tuple[int, int]:
    if len(head) != RECORD.size:
        raise BulkProtocolError(f"a record head is {RECORD.size} bytes, got {len(head)}")
    kind, length = RECORD.unpack(head)
    limit = limits.get(kind)
    if limit is None:
        raise BulkProtocolError(f"bulk {what} record of unknown kind {kind}")
    if length > limit:
        raise BulkProtocolError(f"bulk {what} record of kind {kind} declares {length} bytes (limit {limit})")
    return int(kind), int(length)


def error_payload(code: str, details: str) -> bytes:
    return f"{code} {details}".encode()


def parse_error(payload: Buffer) -> tuple[str, str]:
    """``(STATUS_NAME, details)`` of an ERROR record; a name that is no status name reads as UNKNOWN."""
    code, _, details = bytes(payload).decode(errors="replace").partition(" ")
    if not (code.isascii() and code.replace("_", "").isalpha() and code.isupper()):
        return "UNKNOWN", bytes(payload).decode(errors="replace")
    return code, details
