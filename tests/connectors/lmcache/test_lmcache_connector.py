"""LMCache's remote-tier plumbing on CPU with tierkv's connector against a real vault on loopback.

LMCache's own ``RemoteBackend`` builds the connector from its engine config (``remote_storage_plugins``
and the plugin's module path, through its ``DynamicConnectorAdapter``), its ``LocalCPUBackend``
allocates the chunks, and its event loop runs the connector's coroutines, as in an LMCache engine.
LMCache's engine itself does not run here (it refuses vLLM's CPU backend)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import wait
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("lmcache", reason="LMCache is not installed here (make test-sglang builds .venv-sglang)")

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.remote_backend import RemoteBackend

from tierkv.connectors.lmcache import TierKVConnector
from tierkv.errors import ConfigError
from tierkv.vault.launcher import VaultProcess

pytestmark = [pytest.mark.lmcache, pytest.mark.timeout(300)]

CHUNK = 16
LAYERS, HEADS, DIM = 2, 2, 8
DTYPE = torch.bfloat16


def engine_config(address: str, **tierkv: Any) -> Any:
    plugin = "remote_storage_plugin.tierkv"
    return LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK,
        local_cpu=True,
        max_local_cpu_size=0.05,
        remote_storage_plugins=["tierkv"],
        remote_serde="naive",
        extra_config={
            f"{plugin}.module_path": "tierkv.connectors.lmcache",
            f"{plugin}.class_name": "TierKVConnector",
            f"{plugin}.kv_cold": address,
            f"{plugin}.timeout": 0.5,
            **{f"{plugin}.{k}": v for k, v in tierkv.items()},
        },
    )


@dataclass
class Tier:
    backend: Any
    cpu: Any
    connector: TierKVConnector

    def chunk(self, tokens: int, seed: int) -> Any:
        obj = self.cpu.allocate([torch.Size([2, LAYERS, tokens, HEADS * DIM])], [DTYPE], None)
        gen = torch.Generator().manual_seed(seed)
        obj.tensor.view(torch.int16).copy_(torch.randint(-(2**15), 2**15, obj.tensor.shape, generator=gen))
        return obj

    def put(self, keys: list[Any], chunks: list[Any]) -> None:
        """LMCache's batched put, waited for (its callback fires per key once the write is over)."""
        done = threading.Semaphore(0)
        self.backend.batched_submit_put_task(keys, chunks, on_complete_callback=lambda _k: done.release())
        for _ in keys:
            assert done.acquire(timeout=30), "the put never completed"


def key(chunk_hash: int) -> Any:
    return CacheEngineKey("tiny-test-model", 1, 0, chunk_hash, DTYPE)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


def make_tier(address: str, loop: asyncio.AbstractEventLoop) -> Tier:
    config = engine_config(address)
    metadata = LMCacheMetadata(
        model_name="tiny-test-model",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=DTYPE,
        kv_shape=(LAYERS, 2, CHUNK, HEADS, DIM),
        chunk_size=CHUNK,
    )
    cpu = LocalCPUBackend(config, metadata, dst_device="cpu")
    backend = RemoteBackend(config, metadata, loop, cpu, dst_device="cpu", plugin_name="tierkv")
    connector = backend.connection._connector  # inside LMCache's InstrumentedRemoteConnector
    assert isinstance(connector, TierKVConnector), "LMCache built tierkv's connector"
    return Tier(backend, cpu, connector)


@pytest.fixture
def tier(vault: VaultProcess, loop: asyncio.AbstractEventLoop) -> Iterator[Tier]:
    t = make_tier(vault.address, loop)
    yield t
    t.backend.close()


def bits(obj: Any) -> torch.Tensor:
    return obj.tensor.view(torch.int16).clone()


def test_chunks_round_trip_bit_for_bit(tier: Tier) -> None:
    """Three full chunks and a last one of five tokens, put one by one and in a batch, come back whole."""
    chunks = [tier.chunk(CHUNK, 1), tier.chunk(CHUNK, 2), tier.chunk(CHUNK, 3), tier.chunk(5, 4)]
    want = [bits(c) for c in chunks]
    keys = [key(h) for h in (11, 12, 13, 14)]
    wait([tier.backend.submit_put_task(keys[0], chunks[0])], timeout=30)
    tier.put(keys[1:], chunks[1:])
    assert tier.backend.put_failed_count == 0
    assert tier.backend.batched_contains(keys) == 4
    one = tier.backend.get_blocking(keys[3])
    assert one is not None and tuple(one.tensor.shape) == (2, LAYERS, 5, HEADS * DIM)
    assert torch.equal(bits(one), want[3])
    got = tier.backend.batched_get_blocking(keys)
    assert all(g is not None for g in got)
    assert all(torch.equal(bits(g), w) for g, w in zip(got, want, strict=True))


def test_batched_contains_is_the_leading_run(tier: Tier) -> None:
    stored = [key(21), key(22), key(24)]
    tier.put(stored, [tier.chunk(CHUNK, s) for s in (1, 2, 4)])
    assert tier.backend.batched_contains([key(21), key(22), key(23), key(24)]) == 2
    assert tier.backend.contains(key(24)) and not tier.backend.contains(key(23))
    assert (
        asyncio.run_coroutine_threadsafe(
            tier.connector.batched_async_contains("lookup", [key(21), key(22), key(23)]), tier.backend.loop
        ).result(30)
        == 2
    )


def test_a_corrupt_chunk_is_a_miss_and_is_deleted(tier: Tier) -> None:
    tier.put([key(31)], [tier.chunk(CHUNK, 1)])
    c = tier.connector
    (blob,) = c.storage.get_buffers(c.spec.namespace, c.keys([key(31)]))
    flipped = bytearray(blob)
    flipped[-2] ^= 0x01
    c.storage.put(c.spec.namespace, dict(zip(c.keys([key(31)]), [bytes(flipped)], strict=True)))
    assert bytes(c.storage.get_buffers(c.spec.namespace, c.keys([key(31)]))[0]) == bytes(flipped)
    assert tier.backend.get_blocking(key(31)) is None
    assert tier.backend.batched_contains([key(31)]) == 0, "the corrupt chunk was deleted"


def test_a_stopped_vault_is_a_miss_and_a_failed_put(vault: VaultProcess, tier: Tier) -> None:
    tier.put([key(41)], [tier.chunk(CHUNK, 1)])
    vault.stop()
    assert tier.backend.batched_contains([key(41)]) == 0
    assert tier.backend.get_blocking(key(41)) is None
    wait([tier.backend.submit_put_task(key(42), tier.chunk(CHUNK, 2))], timeout=30)
    assert tier.backend.put_failed_count == 1, "a put no vault acknowledged counts as failed"


def test_remove_deletes_the_chunk(tier: Tier) -> None:
    tier.put([key(51)], [tier.chunk(CHUNK, 1)])
    assert tier.connector.remove_sync(key(51))
    assert not tier.connector.exists_sync(key(51))


def test_bad_settings_name_the_key(loop: asyncio.AbstractEventLoop) -> None:
    config = engine_config("127.0.0.1:1", codex="raw")
    metadata = LMCacheMetadata("m", 1, 1, 0, 0, DTYPE, (LAYERS, 2, CHUNK, HEADS, DIM), chunk_size=CHUNK)
    cpu = LocalCPUBackend(config, metadata, dst_device="cpu")
    with pytest.raises(ConfigError, match=r"remote_storage_plugin\.tierkv: codex: unknown key"):
        TierKVConnector(loop, cpu, config, "tierkv")
    with pytest.raises(ConfigError, match="codec: LMCache chunks are stored raw"):
        TierKVConnector(loop, cpu, engine_config("127.0.0.1:1", codec="int8"), "tierkv")
