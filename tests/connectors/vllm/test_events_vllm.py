"""Cold-tier KV events from a real vLLM engine (CPU, tiny Llama) with a real vault.

vLLM's scheduler collects the connector's events every step and hands them, as a ``KVEventBatch``, to
its publisher; the test's publisher serialises each batch with msgspec exactly as vLLM's ZMQ publisher
does and decodes it back as vLLM's own types. (vLLM's ZMQ publisher connecting to a SUB socket bound in
this same process delivered nothing here, so the socket hop itself is not part of this test.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.connectors.vllm.engine import (
    BLOCK_SIZE,
    generate_counted,
    make_llm,
    module_vault,
    probe_request,
    prompt,
    scheduler_connector,
    shutdown,
    store_then_forget,
    write_tiny_llama,
)
from tierkv.client.vault import VaultClient
from tierkv.vault.launcher import VaultProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPT = prompt(11, 300)  # 9 full blocks
BLOCKS = 9


class Recorder:
    """vLLM's publisher interface: each batch msgpack-encoded as on the wire, decoded on ``events``."""

    def __init__(self) -> None:
        import msgspec

        self.encoder = msgspec.msgpack.Encoder()
        self.payloads: list[bytes] = []

    def publish(self, batch: Any) -> None:
        self.payloads.append(self.encoder.encode(batch))

    def shutdown(self) -> None:
        """Nothing to release."""

    def events(self) -> list[Any]:
        """The events published since the last call, decoded as vLLM's ``KVEventBatch``."""
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        payloads, self.payloads = self.payloads, []
        return [e for p in payloads for e in decoder.decode(p).events]


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VaultProcess]:
    yield from module_vault(tmp_path_factory.mktemp("vault-events"))


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory, vault: VaultProcess) -> Iterator[Any]:
    from vllm.config import KVEventsConfig

    model = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "m")
    events = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    engine = make_llm(
        Path(model), {"kv_cold": vault.address, "timeout": 1.0, "kv_events": True}, kv_events_config=events
    )
    engine.llm_engine.engine_core.engine_core.scheduler.kv_event_publisher = Recorder()
    yield engine
    shutdown(engine)


def block_hashes(tokens: list[int]) -> list[Any]:
    """vLLM's block hashes of ``tokens`` (sha256, the default) as its events carry them."""
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    return [maybe_convert_block_hash(h) for h in probe_request(tokens).block_hashes]


def cold(events: list[Any], kind: str) -> list[Any]:
    return [e for e in events if type(e).__name__ == kind and e.medium == "STORAGE"]


def test_stored_and_removed_blocks_are_published(llm: Any, vault: VaultProcess) -> None:
    subscriber = llm.llm_engine.engine_core.engine_core.scheduler.kv_event_publisher
    hashes = block_hashes(PROMPT)[:BLOCKS]
    _, moved = store_then_forget(llm, PROMPT)
    assert moved["stored_blocks"] == BLOCKS
    published = subscriber.events()
    stored = cold(published, "BlockStored")
    assert [h for e in stored for h in e.block_hashes] == hashes
    # The same ids as vLLM's own events for the blocks in its GPU cache.
    gpu = [
        h
        for e in published
        if type(e).__name__ == "BlockStored" and e.medium == "GPU"
        for h in e.block_hashes
    ]
    assert gpu[:BLOCKS] == hashes
    first = stored[0]
    assert first.parent_block_hash is None
    assert [t for e in stored for t in e.token_ids] == PROMPT[: BLOCKS * BLOCK_SIZE]
    assert first.block_size == BLOCK_SIZE
    assert first.lora_name is None and first.lora_id is None

    conn = scheduler_connector(llm)
    key = conn.keybook.keys(probe_request(PROMPT))[3]
    namespace = conn.identity.stream_namespace(conn.topology.streams[0])
    with VaultClient(vault.address) as client:
        (blob,) = client.get(namespace, [key])
        assert blob is not None
        tampered = bytearray(blob)
        tampered[-1] ^= 0xFF
        assert client.put(namespace, {key: bytes(tampered)}) == 1

    _, seen = generate_counted(llm, PROMPT)
    assert seen["load_errors"] == 1
    events = subscriber.events()
    removed = cold(events, "BlockRemoved")
    assert [e.block_hashes for e in removed] == [[hashes[3]]]
    # The recomputed block was stored again, and announced again.
    assert hashes[3] in [h for e in cold(events, "BlockStored") for h in e.block_hashes]


def test_a_full_event_queue_drops_and_counts() -> None:
    from types import SimpleNamespace

    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    from tierkv.connectors.vllm.events import ColdEvents, TierKVWorkerMeta
    from tierkv.connectors.vllm.stats import Counters

    counters = Counters()
    events = ColdEvents(block_size=2, hash_block_size=1, max_queued=1, counters=counters)
    request = SimpleNamespace(
        request_id="r", block_hashes=[b"a", b"b", b"c", b"d"], all_token_ids=[1, 2, 3, 4], lora_request=None
    )
    events.expect(request, 0, {b"k0": 0, b"k1": 1})
    # Block 0 acknowledged by one worker, block 1 never: one run of two vLLM hashes.
    events.report(TierKVWorkerMeta({"r": [b"k0"]}).aggregate(TierKVWorkerMeta(gone=[b"k1"])))
    (only,) = events.take()
    assert (only.block_hashes, only.token_ids, only.block_size, only.medium) == (
        [maybe_convert_block_hash(b"a"), maybe_convert_block_hash(b"b")],
        [1, 2],
        1,
        "STORAGE",
    )
    events.expect(request, 0, {b"k0": 0, b"k1": 1})
    events.stored("r", [b"k0", b"k1"])  # one event (both blocks contiguous): the queue is full after it
    events.gone([b"k0"])
    assert len(events.take()) == 1
    assert counters.totals()["kv_events_dropped"] == 1
