"""``restore_agreement``: what the lossy int8 codec costs in output, against raw's noise floor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import VaultFactory
from tests.connectors.hf.models import tiny_model
from tierkv.bench.quality import restore_agreement
from tierkv.client.cluster import Cluster


@pytest.fixture
def cluster(vault_factory: VaultFactory) -> Iterator[Cluster]:
    kv = vault_factory("kv", role="kv_cold")
    c = Cluster({"kv_cold": [kv.address]}, timeout=5.0)
    yield c
    c.close()


@pytest.mark.slow
def test_int8_restore_agreement(cluster: Cluster) -> None:
    """int8 KV is lossy: report greedy agreement over 64 tokens and the logit error."""
    raw = restore_agreement(tiny_model("qwen2"), cluster, codec="raw", prompt_len=96, new_tokens=64)
    assert raw.codec == "raw" and raw.agreement == 1.0 and raw.max_logit_error < 1e-4
    result = restore_agreement(tiny_model("qwen2"), cluster, codec="int8", prompt_len=96, new_tokens=64)
    print(
        f"int8: free-running agreement {result.agreement:.3f} (first divergence {result.first_divergence}), "
        f"teacher-forced {result.teacher_forced_agreement:.3f}, logit error max {result.max_logit_error:.4f} "
        f"mean {result.mean_logit_error:.4f} of {result.logit_scale:.2f}"
    )
    assert result.restored_tokens == 80 and result.new_tokens == 64
    assert result.teacher_forced_agreement >= 0.9
    assert 0.0 < result.max_logit_error < 0.1 * result.logit_scale
