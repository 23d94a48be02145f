"""Receive buffers reused by the bulk transport: never while a caller still holds a blob from them."""

from __future__ import annotations

import os

import numpy as np

from tests.conftest import VaultFactory
from tierkv import VaultClient
from tierkv.client.bulk import RecvPool


def address(view: memoryview) -> int:
    return int(np.frombuffer(view, np.uint8).ctypes.data)


def test_a_buffer_is_reused_only_once_nothing_refers_to_it() -> None:
    pool = RecvPool(max_bytes=1 << 20)
    first = pool.take(1000)
    held = first[10:20]  # a blob sliced out of the frame, still held by a caller
    first_at = address(first)
    del first
    second = pool.take(800)
    assert address(second) != first_at, "a buffer with a live view was handed out again"
    del held, second
    third = pool.take(900)
    assert address(third) == first_at and len(third) == 900, "a free buffer is reused"
    array = np.frombuffer(third, np.uint8)  # an array over it pins it too
    del third
    assert address(pool.take(900)) != first_at
    del array


def test_beyond_its_bytes_the_pool_hands_out_buffers_it_does_not_keep() -> None:
    pool = RecvPool(max_bytes=1000)
    kept = pool.take(600)
    extra = pool.take(600)
    assert len(extra) == 600
    del extra
    assert address(pool.take(600)) != address(kept), "the unkept buffer is not reused"


def test_blobs_held_from_one_get_survive_later_gets_that_reuse_buffers(vault_factory: VaultFactory) -> None:
    vault = vault_factory()
    blobs = {f"k{i}".encode(): os.urandom(300_000) for i in range(40)}  # 12 MB: several 4 MiB frames
    with VaultClient(vault.address) as client:
        client.put(b"ns", blobs)
        keys = list(blobs)
        held = client.get_buffers(b"ns", keys[:20])
        seen: dict[int, bytes] = {}
        for _ in range(3):
            seen.clear()
            sizes = client.get_each(b"ns", keys, lambda i, b: seen.__setitem__(i, bytes(b)))
            assert sizes == [300_000] * 40 and [seen[i] for i in range(40)] == list(blobs.values())
        assert client.transport.bulk is not None, "the gets went over the bulk port"
        assert [bytes(b) for b in held if b is not None] == [blobs[k] for k in keys[:20]], "held blobs intact"
