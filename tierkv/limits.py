"""Every size limit of tierkv, in one module, so the vault, the wire and the clients agree.

Limits that the vault enforces are also what clients split their work by: a client never builds a request
a vault with default settings refuses.
"""

from __future__ import annotations

from typing import Final

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

MAX_NAMESPACE_BYTES: Final = 255
"""A namespace is stored as a one-byte length plus the bytes (see ``tierkv.vault.store``)."""
MAX_KEY_BYTES: Final = 1024
MAX_KEYS_PER_CALL: Final = 1 << 20

FRAME_BYTES: Final = 4 * MiB
"""Bulk payloads travel in frames of about this size (gRPC messages or bulk-port records)."""
MAX_MESSAGE_BYTES: Final = 64 * MiB
"""gRPC message limit on both ends."""
MAX_ITEM_BYTES: Final = GiB
"""The largest single blob a vault accepts."""
MAX_BATCH_BYTES: Final = GiB
"""The most bytes one Put may carry (the vault writes it in transactions of at most ``max_bytes / 16``)."""
CLIENT_BATCH_BYTES: Final = 64 * MiB
"""Clients split a put into batches of at most this many bytes."""
HOOK_PUT_BYTES: Final = 32 * MiB
"""Engine hooks hand the cluster puts of at most this many bytes (bounds memory of encoded blobs)."""
MAX_BULK_REQUEST_BYTES: Final = 64 * MiB
"""The largest request header the bulk port reads."""
MAX_AUTH_TOKEN_BYTES: Final = 4 * KiB
"""The longest auth token, on gRPC (``authorization: Bearer``) and on the bulk port alike; a vault refuses a
token file naming a longer one, and a client refuses to send one."""
MIN_GOOD_TOKEN_BYTES: Final = 16
"""A vault warns about a shorter auth token (a warning, not a refusal: it says which line)."""
MAX_BLOCK_TOKEN_BYTES: Final = 64 * KiB
"""The token ids a block may carry in its metadata (int32 each; a vault refuses more)."""
MAX_HOTTEST_REPLY_BYTES: Final = 16 * MiB
"""A Hottest reply's keys and token ids together (a quarter of the gRPC message limit): chains past it
are left out and the reply says it was truncated. One chain's token ids may take all of it."""


def check_namespace(namespace: bytes) -> bytes:
    """``namespace`` if it fits; ValueError otherwise."""
    if len(namespace) > MAX_NAMESPACE_BYTES:
        raise ValueError(f"namespace longer than {MAX_NAMESPACE_BYTES} bytes")
    return namespace


def check_key(key: bytes) -> bytes:
    """``key`` if its length is within 1..MAX_KEY_BYTES; ValueError otherwise."""
    if not key or len(key) > MAX_KEY_BYTES:
        raise ValueError(f"key length {len(key)} outside 1..{MAX_KEY_BYTES}")
    return key


__all__ = [
    "CLIENT_BATCH_BYTES",
    "FRAME_BYTES",
    "HOOK_PUT_BYTES",
    "MAX_AUTH_TOKEN_BYTES",
    "MAX_BATCH_BYTES",
    "MAX_BLOCK_TOKEN_BYTES",
    "MAX_BULK_REQUEST_BYTES",
    "MAX_HOTTEST_REPLY_BYTES",
    "MAX_ITEM_BYTES",
    "MAX_KEYS_PER_CALL",
    "MAX_KEY_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_NAMESPACE_BYTES",
    "MIN_GOOD_TOKEN_BYTES",
    "GiB",
    "KiB",
    "MiB",
    "check_key",
    "check_namespace",
]
