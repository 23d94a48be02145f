from __future__ import annotations

import asyncio
import os

import pytest

from tests.conftest import VaultFactory
from tierkv import AsyncVaultClient
from tierkv.errors import AuthError, VaultUnavailable


def test_async_client_roundtrip(vault_factory: VaultFactory) -> None:
    v = vault_factory()
    blobs = {f"k{i}".encode(): os.urandom(n) for i, n in enumerate([10, 6 << 20, 0])}

    async def run() -> None:
        async with AsyncVaultClient(v.address) as c:
            assert await c.put(b"ns", blobs) == 3
            assert await c.get(b"ns", [*blobs, b"nope"]) == [*blobs.values(), None]
            assert await c.prefix_lookup(b"ns", [b"k0", b"k1", b"nope"]) == 2
            assert await c.delete(b"ns", [b"k0"]) == 1
            assert (await c.stats()).keys == 2
            assert await c.flush(b"ns") == 2
            assert await c.health()

    asyncio.run(run())


def test_async_client_errors_are_mapped(vault_factory: VaultFactory) -> None:
    v = vault_factory(env={"TIERKV_TOKEN": "t"})

    async def run() -> None:
        async with AsyncVaultClient(v.address) as c:
            with pytest.raises(AuthError):
                await c.stats()
        async with AsyncVaultClient("127.0.0.1:1", timeout=0.3) as c:
            with pytest.raises(VaultUnavailable):
                await c.get(b"ns", [b"k"])

    asyncio.run(run())


def test_async_client_says_which_blobs_a_vault_refused(vault_factory: VaultFactory) -> None:
    v = vault_factory(max_bytes="1MiB")

    async def run() -> None:
        async with AsyncVaultClient(v.address) as c:
            ack = await c.put_acks(b"ns", [(b"big", os.urandom(2 << 20)), (b"small", b"x")])
            assert (ack.stored, ack.rejected) == ((1,), (0,))
            assert await c.put(b"ns", {b"big": os.urandom(2 << 20)}) == 0

    asyncio.run(run())
