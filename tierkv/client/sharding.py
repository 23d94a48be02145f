"""Rendezvous (highest-random-weight) hashing: which vaults own a key.

Each (vault, key) pair gets a score from a seeded xxh3; a key's owners are the ``r`` vaults with the
highest scores. Adding a vault moves only the keys it now wins (about 1/n of them), and every process
computes the same owners with no coordination.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash


class Rendezvous:
    def __init__(self, nodes: Sequence[str]) -> None:
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"duplicate vault addresses: {list(nodes)}")
        self.nodes = list(nodes)
        self._seeds = [xxhash.xxh3_64_intdigest(node.encode()) for node in self.nodes]

    def owners(self, key: bytes, replicas: int = 1) -> list[int]:
        """Indices of the vaults that own ``key``, best first."""
        if len(self.nodes) == 1:
            return [0]
        scores = sorted(
            ((xxhash.xxh3_64_intdigest(key, seed=seed), i) for i, seed in enumerate(self._seeds)),
            reverse=True,
        )
        return [i for _, i in scores[: max(1, replicas)]]
