"""The bench hook runs end to end on a tiny model (figures come from the real run, not from here)."""

from __future__ import annotations

from tests.conftest import VaultFactory
from tests.connectors.hf_models import tiny_model
from tierkv.client.cluster import Cluster
from tierkv.connectors.hf.bench import run_hf_bench


def test_bench_reports_prefill_hot_and_cold(vault_factory: VaultFactory) -> None:
    kv = vault_factory("kv", role="kv_cold")
    cluster = Cluster({"kv_cold": [kv.address]}, timeout=5.0)
    try:
        result = run_hf_bench([64, 100], cluster=cluster, model=tiny_model("qwen2"), repeats=2)
    finally:
        cluster.close()
    assert [p.prompt_tokens for p in result.points] == [64, 100]
    first, second = result.points
    assert first.hot_restored_tokens == 63 and first.cold_restored_tokens == 48
    assert second.cold_restored_tokens == 96
    assert second.cold_bytes >= 96 * second.kv_bytes_per_token
    assert all(v > 0 for v in (second.prefill_ttft_s, second.hot_ttft_s, second.cold_ttft_s))
    assert abs(sum(second.restore_shares().values()) - 1.0) < 1e-6
    assert len(result.to_dict()["points"][0]["runs"]["cold_ttft_s"]) == 2
