"""tierkv-bulk/1: the raw-TCP data plane that carries BatchGet replies beside gRPC.

gRPC Python spends most of a large BatchGet in its own per-message work (on 2 cores it tops out near
1.5 GB/s, below Redis and well below the ~2.5 GB/s a plain socket reaches). The vault therefore also
listens on a bulk port (advertised in ``StatsReply.bulk_port``) where the same ``Frame`` messages are sent
with scatter-gather ``sendmsg`` straight out of LMDB's memory map. gRPC keeps everything else: control
calls, Put, health, TLS; with TLS configured the bulk port is off and BatchGet stays on gRPC.

Request (client → vault)::

    b"TKVB" | u8 version (1) | u8 op (1 = BatchGet) | u32 token length | token | u32 length | BatchGetRequest

Reply (vault → client): records ``u8 kind | u32 length | payload``; kind FRAME carries one
``tierkv.v1.Frame`` exactly as gRPC would, END (length 0) closes a complete reply — the connection then
takes the next request —, ERROR carries ``"STATUS_NAME details"`` in UTF-8 and the vault closes the
connection. This module does no I/O.
"""

from __future__ import annotations

import struct

MAGIC = b"TKVB"
VERSION = 1
OP_BATCH_GET = 1
FRAME, END, ERROR = 1, 2, 3
REQUEST_HEAD = struct.Struct("<4sBBI")
LENGTH = struct.Struct("<I")
RECORD = struct.Struct("<BI")
MAX_TOKEN_BYTES = 4096
MAX_REQUEST_BYTES = 64 * 1024 * 1024


class BulkProtocolError(ValueError):
    """The peer sent something that is not tierkv-bulk/1."""


def encode_request(token: str | None, request: bytes) -> bytes:
    secret = (token or "").encode()
    head = REQUEST_HEAD.pack(MAGIC, VERSION, OP_BATCH_GET, len(secret))
    return b"".join([head, secret, LENGTH.pack(len(request)), request])


def parse_request_head(head: bytes) -> int:
    """Validate the fixed head; returns the token length that follows."""
    magic, version, op, token_len = REQUEST_HEAD.unpack(head)
    if magic != MAGIC:
        raise BulkProtocolError("not a tierkv-bulk request")
    if version != VERSION or op != OP_BATCH_GET:
        raise BulkProtocolError(f"unsupported bulk version {version} or operation {op}")
    if token_len > MAX_TOKEN_BYTES:
        raise BulkProtocolError("token too long")
    return int(token_len)


def record(kind: int, length: int) -> bytes:
    return RECORD.pack(kind, length)


def error_payload(code: str, details: str) -> bytes:
    return f"{code} {details}".encode()


def parse_error(payload: bytes) -> tuple[str, str]:
    code, _, details = payload.decode(errors="replace").partition(" ")
    return code, details
