"""A toy engine and its tierkv hook: the template a new engine hook starts from (docs/adding-a-hook.md).

The engine is as small as an engine can be and still have the properties that matter: a paged KV cache
of fixed-size blocks, a prefill whose KV of a token depends on every token before it, and an output that
changes if any bit of any KV row is wrong. The hook is what every real hook is, and only that:

1. identity: a :class:`~tierkv.keys.Namespace` for what makes its KV reusable, and chained block keys;
2. lookup (the engine's scheduler): how many leading full blocks the vaults hold, leased until the load;
3. load (the engine's worker): one restore of those blocks into the cache, every blob verified; a block
   that fails verification is a miss (recomputed) and is deleted by the pipeline;
4. store (after the request): the full blocks, tagged from the request's layout, through one pipeline call.

It never speaks gRPC, never builds a blob and never catches a vault error: the pipeline makes every vault
failure a miss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from tierkv.codec import LayerGroup
from tierkv.keys import Namespace, block_keys
from tierkv.retention import Retention, chain_meta
from tierkv.retention.layout import Layout
from tierkv.tiering import ColdTier, NumpyArrays, Storage, StreamSpec, full_blocks

LAYERS, HEADS, DIM, VOCAB = 2, 2, 8, 1000


class ToyEngine:
    """A deterministic "model": the KV of token ``t`` is a function of every token up to ``t``."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.namespace = Namespace(model="toy-engine", dtype="float32", codec="raw", layout="toy-v1")
        self.block_shape = (LAYERS, 2, block_tokens, HEADS, DIM)

    def kv_rows(self, tokens: Sequence[int], start: int, cache: np.ndarray) -> None:
        """Prefill ``tokens[start:]`` into ``cache`` (one row per token), after the rows before ``start``."""
        state = float(cache[start - 1].sum()) if start else 0.0
        for t in range(start, len(tokens)):
            phase = np.arange(LAYERS * 2 * HEADS * DIM, dtype=np.float32).reshape(LAYERS, 2, HEADS, DIM)
            cache[t] = np.sin(phase * 0.01 + tokens[t] * 0.37 + t * 0.011 + state * 1e-3)
            state = float(cache[t].sum())

    def next_token(self, cache: np.ndarray, length: int) -> int:
        """The output: any wrong bit in any row changes it (with overwhelming probability)."""
        digest = np.frombuffer(np.ascontiguousarray(cache[:length]).tobytes(), dtype=np.uint64)
        return int(np.bitwise_xor.reduce(digest) % VOCAB)

    def reference(self, tokens: Sequence[int]) -> int:
        cache = np.zeros((len(tokens), LAYERS, 2, HEADS, DIM), np.float32)
        self.kv_rows(tokens, 0, cache)
        return self.next_token(cache, len(tokens))


@dataclasses.dataclass
class RunStats:
    looked_up: int = 0
    restored_tokens: int = 0
    rejected: int = 0
    stored: int = 0


class ToyHook:
    """The engine's tierkv hook: lookup, load and store through one :class:`ColdTier`."""

    def __init__(self, engine: ToyEngine, storage: Storage, *, lease_ms: int = 30_000) -> None:
        self.engine = engine
        self.tier: ColdTier[np.ndarray] = ColdTier(storage, NumpyArrays())
        self.spec = StreamSpec(engine.namespace.digest, LayerGroup.ATTENTION)
        self.lease_ms = lease_ms
        self.retention = Retention()
        self.last = RunStats()

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        return block_keys(tokens, self.engine.block_tokens, namespace=self.engine.namespace)

    def lookup(self, tokens: Sequence[int]) -> int:
        """Leading blocks the vaults hold, leased; a restore always leaves the last token to compute."""
        keys = self.keys(tokens)[: full_blocks(len(tokens) - 1, self.engine.block_tokens)]
        return self.tier.lookup(self.spec, keys, lease_ms=self.lease_ms)

    def load(self, tokens: Sequence[int], blocks: int, cache: np.ndarray) -> int:
        """Restore ``blocks`` leading blocks into ``cache``; how many tokens arrived verified in order."""
        bt = self.engine.block_tokens
        keys = self.keys(tokens)[:blocks]
        expect = self.spec.expect(self.engine.block_shape, bt)
        staging = [np.empty(self.engine.block_shape, np.float32) for _ in keys]
        got = self.tier.restore(self.spec, keys, expect, staging.__getitem__, leading_only=True)
        self.last.rejected = got.rejected
        for n in range(got.leading):  # block (layers, kv, tokens, heads, dim) → rows (tokens, ...)
            cache[n * bt : (n + 1) * bt] = np.moveaxis(staging[n], 2, 0)
        return got.leading * bt

    def store(self, tokens: Sequence[int], cache: np.ndarray, layout: Layout | None) -> int:
        bt = self.engine.block_tokens
        keys = self.keys(tokens)
        meta = chain_meta(keys, bt, self.retention, layout=layout, tokens=tokens)
        blocks = (
            (k, np.ascontiguousarray(np.moveaxis(cache[i * bt : (i + 1) * bt], 0, 2)), bt)
            for i, k in enumerate(keys)
        )
        return self.tier.store(self.spec, blocks, meta).stored

    def run(self, tokens: Sequence[int], layout: Layout | None = None) -> int:
        """One request as the engine serves it: lookup, load, compute the rest, answer, store."""
        self.last = RunStats()
        cache = np.zeros((len(tokens), LAYERS, 2, HEADS, DIM), np.float32)
        self.last.looked_up = self.lookup(tokens)
        start = self.load(tokens, self.last.looked_up, cache) if self.last.looked_up else 0
        self.last.restored_tokens = start
        self.engine.kv_rows(tokens, start, cache)
        out = self.engine.next_token(cache, len(tokens))
        self.last.stored = self.store(tokens, cache, layout)
        return out

    def close(self) -> None:
        self.tier.close()
