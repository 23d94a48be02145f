"""The scheduler half's lookups lease what they found, so a flood of other puts between lookup and load
does not take the blocks away (a real vault process, without vLLM)."""

from __future__ import annotations

import pytest

from tests.conftest import VaultFactory
from tests.connectors.vllm.test_scheduler_logic import (
    BS,
    KEYS,
    NAMESPACE,
    FakeRequest,
    make_scheduler,
    matched,
)
from tierkv.client.cluster import Cluster
from tierkv.config import settings_from_dict
from tierkv.connectors.vllm.settings import SOURCE, ConnectorSettings
from tierkv.errors import ConfigError

BLOB = b"x" * 16_000


@pytest.mark.parametrize("lease_ms", [2000, 0])
def test_blocks_a_lookup_found_outlive_a_flood_only_under_a_lease(
    vault_factory: VaultFactory, lease_ms: int
) -> None:
    vault = vault_factory(max_bytes="1MiB", sync="fast")
    with Cluster({"kv_cold": vault.address}, timeout=30) as cluster:
        assert cluster.put(NAMESPACE, {k: BLOB for k in KEYS[:4]}).stored == 4
        scheduler = make_scheduler(vault.address, lookup_lease_ms=lease_ms)
        try:
            assert matched(scheduler, FakeRequest("r", num_tokens=4 * BS + 1))[0] == 4 * BS
        finally:
            scheduler.shutdown()
        for i in range(8):  # 2 MiB through a 1 MiB vault
            cluster.put(b"flood", {b"%d-%d" % (i, j): BLOB for j in range(16)})
        loaded = cluster.get(NAMESPACE, KEYS[:4])
    if lease_ms:
        assert loaded == [BLOB] * 4
    else:
        assert loaded == [None] * 4


def test_the_lease_setting_is_bounded() -> None:
    assert ConnectorSettings().lookup_lease_ms == 2000
    with pytest.raises(ConfigError, match="lookup_lease_ms"):
        settings_from_dict(ConnectorSettings, {"lookup_lease_ms": 60_000}, SOURCE)
