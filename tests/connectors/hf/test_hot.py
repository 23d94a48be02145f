from __future__ import annotations

import numpy as np
import pytest

from tierkv.config import ContextWeights
from tierkv.connectors.hf.hot import HotEntry, HotTier, common_prefix_len


def test_common_prefix_len() -> None:
    a = np.array([1, 2, 3, 4], dtype=np.int64)
    assert common_prefix_len(a, np.array([1, 2, 9], dtype=np.int64)) == 2
    assert common_prefix_len(a, a[:2]) == 2
    assert common_prefix_len(a, np.array([], dtype=np.int64)) == 0
    assert common_prefix_len(a, np.array([7], dtype=np.int64)) == 0


def test_longest_prefix_picks_the_entry_sharing_most_tokens() -> None:
    hot: HotTier[str] = HotTier(1000)
    hot.put([1, 2, 3], "short", 10)
    hot.put([1, 2, 7, 8, 9], "other", 10)
    hot.put([5, 6], "unrelated", 10)
    entry, n = hot.longest_prefix([1, 2, 3, 4, 5])
    assert entry is not None and entry.payload == "short" and n == 3
    entry, n = hot.longest_prefix([1, 2, 7, 8, 0])
    assert entry is not None and entry.payload == "other" and n == 4
    assert hot.longest_prefix([9, 9]) == (None, 0)


def test_usable_callback_lowers_the_match() -> None:
    hot: HotTier[str] = HotTier(1000)
    hot.put([1, 2, 3, 4, 5, 6], "a", 10)
    hot.put([1, 2, 3, 4, 9], "b", 10)
    # "a" can only be restored at position 2, "b" anywhere: "b" wins with 4.
    entry, n = hot.longest_prefix(
        [1, 2, 3, 4, 5, 6, 7], usable=lambda e, lcp: min(lcp, 2) if e.payload == "a" else lcp
    )
    assert entry is not None and entry.payload == "b" and n == 4


def test_eviction_is_lru_by_bytes_and_reports_victims() -> None:
    evicted: list[HotEntry[str]] = []
    hot: HotTier[str] = HotTier(100, on_evict=evicted.append)
    hot.put([1], "a", 40)
    hot.put([2], "b", 40)
    hot.longest_prefix([1])  # touch "a": "b" is now the LRU
    hot.put([3], "c", 40)
    assert [e.payload for e in evicted] == ["b"]
    assert hot.nbytes == 80 and len(hot) == 2
    assert hot.evictions == 1


def test_superseded_prefix_is_dropped_without_eviction() -> None:
    evicted: list[HotEntry[str]] = []
    hot: HotTier[str] = HotTier(100, on_evict=evicted.append)
    hot.put([1, 2], "turn1", 30)
    assert [e.payload for e in hot.superseded_by([1, 2, 3])] == ["turn1"]
    assert hot.superseded_by([1, 3]) == []
    hot.put([1, 2, 3, 4], "turn2", 50)
    assert evicted == []
    assert [e.payload for e in hot.entries()] == ["turn2"]
    assert hot.nbytes == 50


def test_oversized_entry_goes_straight_to_eviction() -> None:
    evicted: list[HotEntry[str]] = []
    hot: HotTier[str] = HotTier(10, on_evict=evicted.append)
    hot.put([1, 2], "big", 11)
    assert [e.payload for e in evicted] == ["big"] and len(hot) == 0 and hot.nbytes == 0


def test_evict_all_discard_and_failing_callback() -> None:
    def boom(entry: HotEntry[str]) -> None:
        raise RuntimeError("store failed")

    hot: HotTier[str] = HotTier(100, on_evict=boom)
    kept = hot.put([1], "a", 10)
    hot.put([2], "b", 10)
    assert hot.discard(kept) and not hot.discard(kept)
    assert hot.evict_all() == 1  # the failing callback is logged, not raised
    assert len(hot) == 0 and hot.nbytes == 0


def test_tokens_are_copied_and_frozen() -> None:
    src = np.array([1, 2, 3], dtype=np.int64)
    hot: HotTier[str] = HotTier(100)
    entry = hot.put(src, "x", 1)
    src[0] = 99
    assert entry.tokens[0] == 1
    with pytest.raises(ValueError):
        entry.tokens[0] = 5


def test_eviction_follows_the_vaults_context_score_with_protected_prefixes_last() -> None:
    evicted: list[HotEntry[str]] = []
    hot: HotTier[str] = HotTier(400, on_evict=evicted.append)
    hot.put([1], "pinned", 100, importance=0.2, protected=True)  # oldest and unimportant, but protected
    hot.put([2], "generation", 100, importance=0.1)
    hot.put([3], "context", 100, importance=0.5)
    hot.put([4], "hit", 100, importance=0.5)
    hot.put([5], "axioms", 100, importance=1.0)  # over budget: the lowest score goes
    assert [e.payload for e in evicted] == ["generation"]
    for _ in range(3):
        hot.longest_prefix([4, 0])
    assert [e.payload for e in hot.eviction_order()] == ["context", "hit", "axioms", "pinned"]
    hot.put([6], "new", 300)  # a newcomer never hit scores below the hit entry and axioms
    assert [e.payload for e in evicted] == ["generation", "context", "new"]
    assert sorted(e.payload for e in hot.entries()) == ["axioms", "hit", "pinned"]


def test_a_longer_entry_inherits_what_the_prefix_it_supersedes_knew() -> None:
    hot: HotTier[str] = HotTier(1000)
    hot.put([1, 2], "system", 10, importance=1.0, protected=True)
    hot.longest_prefix([1, 2, 3])
    entry = hot.put([1, 2, 3, 4], "turn", 10)
    assert entry.protected and entry.importance == 1.0 and entry.hits > 0


def test_the_weights_given_decide_the_order() -> None:
    def first_evicted(weights: ContextWeights | None) -> str:
        evicted: list[HotEntry[str]] = []
        hot: HotTier[str] = HotTier(200, on_evict=evicted.append, weights=weights)
        hot.put([1], "important", 100, importance=1.0)
        hot.put([2], "plain", 100, importance=0.1)
        hot.put([3], "new", 100, importance=0.5)
        return evicted[0].payload

    assert first_evicted(None) == "plain"
    assert first_evicted(ContextWeights(importance=0.0)) == "important"  # importance ignored: the oldest
