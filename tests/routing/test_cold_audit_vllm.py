"""The cold-event audit against a real vault: announced blocks that leave the vault are announced
removed, cut at the first hole (a restore reads leading blocks only); a vault that does not answer
removes nothing."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.conftest import VaultFactory
from tierkv.client.vault import VaultClient
from tierkv.connectors.vllm.events import ColdEvents
from tierkv.connectors.vllm.stats import Counters

pytestmark = [pytest.mark.vllm]

NS = b"audit-ns"
KEYS = [bytes([i]) * 16 for i in range(4)]


def announced(events: ColdEvents) -> list[object]:
    request = SimpleNamespace(
        request_id="r", block_hashes=[b"a", b"b", b"c", b"d"], all_token_ids=[1, 2, 3, 4], lora_request=None
    )
    events.expect(request, 0, {k: i for i, k in enumerate(KEYS)})
    events.stored("r", KEYS)
    (stored,) = events.take()
    assert type(stored).__name__ == "BlockStored" and len(stored.block_hashes) == 4
    return list(stored.block_hashes)


def test_blocks_that_left_the_vault_are_announced_removed(vault_factory: VaultFactory) -> None:
    vault = vault_factory()
    with VaultClient(vault.address) as client:
        client.put(NS, {k: b"x" * 64 for k in KEYS})
        events = ColdEvents(block_size=1, hash_block_size=1, max_queued=100, counters=Counters())
        _, _, c, d = announced(events)

        def hits(keys: list[bytes]) -> int:
            return client.prefix_lookup(NS, keys)

        assert events.audit(hits) == 0 and events.take() == []
        client.delete(NS, [KEYS[2]])
        assert events.audit(hits) == 2  # the hole and the block after it
        gone = events.take()
        assert {(type(e).__name__, e.medium) for e in gone} == {("BlockRemoved", "STORAGE")}
        assert [h for e in gone for h in e.block_hashes] == [c, d]
        assert events.audit(hits) == 0 and events.take() == []  # announced once


def test_an_unanswering_vault_removes_nothing_and_the_watcher_stops() -> None:
    events = ColdEvents(block_size=1, hash_block_size=1, max_queued=100, counters=Counters())
    announced(events)
    calls: list[int] = []

    def down(keys: list[bytes]) -> int:
        calls.append(len(keys))
        raise ConnectionError("vault down")

    assert events.audit(down) == 0 and events.take() == []
    events.watch(down, interval=0.05)
    deadline = time.monotonic() + 10
    while len(calls) < 3:
        assert time.monotonic() < deadline, "the watcher did not run"
        time.sleep(0.02)
    events.close()
    assert events.take() == []
