"""Which blocks a finished request offers for GPU protection, and the settings that bound it, without vLLM.

The holding itself is tested against vLLM's real ``BlockPool`` and ``Scheduler`` in ``test_protect.py``.
"""

from __future__ import annotations

import pytest

from tierkv.connectors.vllm.protect import Candidate, candidates, leading_protected, request_candidates
from tierkv.connectors.vllm.settings import ConnectorSettings
from tierkv.errors import ConfigError
from tierkv.retention import BlockMeta, Retention, as_chunks

BS = 16


def test_the_run_stops_at_the_first_unprotected_block() -> None:
    metas = [BlockMeta("axioms", 1.0, protected=True), BlockMeta("rules", 0.9, protected=True)]
    assert leading_protected([*metas, BlockMeta("tools"), BlockMeta("axioms", protected=True)]) == [1.0, 0.9]
    assert leading_protected([BlockMeta("tools"), *metas]) == []


def test_each_group_offers_the_blocks_inside_the_run_at_its_own_block_size() -> None:
    run = [1.0, 0.9, 0.8]  # three blocks of BS tokens: 48 tokens
    offered = candidates([[10, 11, 12, 13], [20, 21, 22]], [BS, 2 * BS], run, BS)
    assert offered == [
        Candidate(10, 1.0, 0),
        Candidate(11, 0.9, 1),
        Candidate(12, 0.8, 2),
        Candidate(20, 0.9, 0),  # covers run blocks 0 and 1: the lower importance
    ], "group 1's second block (tokens 32..63) reaches past the run"
    assert candidates([[10, 11]], [BS], run, BS) == [Candidate(10, 1.0, 0), Candidate(11, 0.9, 1)]


def test_a_request_offers_its_leading_protected_prompt_blocks_only() -> None:
    layout = as_chunks(
        [
            {"tokens": [0, 2 * BS], "source": "axioms"},
            {"tokens": [2 * BS, 3 * BS], "source": "tools"},
            {"tokens": [3 * BS, 4 * BS], "source": "rules"},
        ]
    )
    offered = request_candidates(layout, 4 * BS + 3, [[5, 6, 7, 8]], [BS], BS, Retention())
    assert [c.block_id for c in offered] == [5, 6], "rules behind tools are unreachable without tools"
    assert request_candidates(None, 4 * BS, [[5, 6, 7, 8]], [BS], BS, Retention()) == []
    tools_only = as_chunks([{"tokens": [0, 4 * BS], "source": "tools"}])
    assert request_candidates(tools_only, 4 * BS, [[5, 6, 7, 8]], [BS], BS, Retention()) == []


def test_a_block_that_straddles_a_protected_chunk_is_offered() -> None:
    layout = as_chunks(
        [{"tokens": [0, BS + 5], "source": "identity"}, {"tokens": [BS + 5, 3 * BS], "source": "tools"}]
    )
    offered = request_candidates(layout, 3 * BS, [[5, 6, 7]], [BS], BS, Retention())
    assert [c.block_id for c in offered] == [5, 6], "block 1 straddles identity and tools: it takes identity"


@pytest.mark.parametrize("key", ["gpu_protect_fraction", "gpu_protect_watermark"])
def test_protect_settings_are_bounded(key: str) -> None:
    assert ConnectorSettings.from_extra({"kv_cold": "127.0.0.1:1", key: 0.0}).kv_cold
    with pytest.raises(ConfigError, match=key):
        ConnectorSettings.from_extra({"kv_cold": "127.0.0.1:1", key: 0.9})
    with pytest.raises(ConfigError, match=key):
        ConnectorSettings.from_extra({"kv_cold": "127.0.0.1:1", key: -0.1})
