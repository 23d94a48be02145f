"""Eviction and admission policies: decide *what* goes when the store needs room; the store moves bytes.

- :mod:`.base` — what a policy is to the store (a rank per entry; a learning policy also admits, observes
  and says where the victim search starts);
- :mod:`.recency` — ``lru`` and ``priority-lru``;
- :mod:`.context` — ``context``: importance, hits, sharing, size and age in one score;
- :mod:`.adaptive` — ``adaptive``, the default: learns reuse from the traffic, no setting;
- :mod:`.learning` — the adaptive policy's bounded learning state.
"""

from __future__ import annotations

from typing import Final

from tierkv.config import ContextWeights
from tierkv.vault.policy.adaptive import AdaptivePolicy
from tierkv.vault.policy.base import EntryInfo, EvictionPolicy, Learner, LearningPolicy
from tierkv.vault.policy.context import ContextPolicy, context_score, context_value
from tierkv.vault.policy.recency import LRUPolicy, PriorityLRUPolicy

DEFAULT_POLICY: Final = AdaptivePolicy.name
POLICIES: Final = (AdaptivePolicy.name, LRUPolicy.name, PriorityLRUPolicy.name, ContextPolicy.name)


def make_policy(name: str, weights: ContextWeights | None = None) -> EvictionPolicy:
    """The policy called ``name`` (``weights`` for ``context``); ValueError naming the known ones."""
    if name == ContextPolicy.name:
        return ContextPolicy(weights)
    if name == AdaptivePolicy.name:
        return AdaptivePolicy()
    if name == LRUPolicy.name:
        return LRUPolicy()
    if name == PriorityLRUPolicy.name:
        return PriorityLRUPolicy()
    raise ValueError(f"unknown eviction policy {name!r} (known: {', '.join(POLICIES)})")


def as_learning(policy: EvictionPolicy) -> LearningPolicy | None:
    """The policy as a learning one, or None (the store then only ranks)."""
    return policy if isinstance(policy, AdaptivePolicy) else None


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "AdaptivePolicy",
    "ContextPolicy",
    "EntryInfo",
    "EvictionPolicy",
    "LRUPolicy",
    "Learner",
    "LearningPolicy",
    "PriorityLRUPolicy",
    "as_learning",
    "context_score",
    "context_value",
    "make_policy",
]
