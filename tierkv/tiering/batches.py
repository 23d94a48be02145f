"""Blobs grouped into put calls bounded in bytes, for every engine hook that ships blocks.

Items are consumed lazily, so a caller that encodes blocks on the fly holds at most one batch of
encoded blobs at a time, and no single put grows past the vaults' message limits.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def byte_batches(items: Iterable[tuple[bytes, bytes]], max_bytes: int) -> Iterator[dict[bytes, bytes]]:
    """Consecutive batches of ``(key, blob)`` items; a batch ends once it holds ``max_bytes`` or more."""
    batch: dict[bytes, bytes] = {}
    size = 0
    for key, blob in items:
        batch[key] = blob
        size += len(blob)
        if size >= max_bytes:
            yield batch
            batch, size = {}, 0
    if batch:
        yield batch


__all__ = ["byte_batches"]
