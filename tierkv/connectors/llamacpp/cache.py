"""``Llama.set_cache`` over the vaults: llama-cpp-python's own cache hooks, answered block by block.

``Llama.create_completion`` (and the chat calls and ``llama_cpp.server`` on top of it) asks its cache
for the prompt's tokens before generating and loads the answer when it covers more of the prompt than
the context holds; after generating it hands the cache the whole context's state. This cache answers
the first from the vaults (a whole-context state rebuilt from the leading run of stored blocks) and
ships the second's full blocks in the background. Nothing is held in memory: llama.cpp's context is
the hot tier, the vaults the cold one.

A vault failure, a corrupt block or a state this hook cannot cut never raises into the call: a lookup
answers ``KeyError`` (llama-cpp-python then computes the prompt) and a store is skipped and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from llama_cpp.llama import LlamaState
from llama_cpp.llama_cache import BaseLlamaCache

from tierkv.connectors.llamacpp.hook import LlamaTier, Restore

log = logging.getLogger(__name__)


class TieredLlamaCache(BaseLlamaCache):  # type: ignore[misc]
    """A ``llama_cpp`` cache whose entries live in the vaults; ``hits`` / ``last`` say what it restored."""

    def __init__(self, tier: LlamaTier) -> None:
        super().__init__(capacity_bytes=0)
        self.tier = tier
        self.hits = 0
        self.last = Restore()

    @property
    def cache_size(self) -> int:
        """Bytes held in memory: none (the vaults keep their own accounts)."""
        return 0

    def __contains__(self, key: Sequence[int]) -> bool:
        tokens = [int(t) for t in key]
        try:
            return self.tier.lookup(tokens) > self.tier.held(tokens)
        except Exception:  # a lookup is an optimisation: never an error in the serving path
            log.exception("looking a prompt up in the vaults failed")
            return False

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        """The stored prefix of ``key`` as a state ``Llama.load_state`` takes, when it is longer than what
        the context holds; ``KeyError`` otherwise."""
        tokens = [int(t) for t in key]
        try:
            n, data, self.last = self.tier.context_state(tokens, beyond=self.tier.held(tokens))
        except Exception:
            log.exception("restoring a prompt from the vaults failed")
            n = 0
        if n == 0:
            raise KeyError("not in the vaults beyond what the context holds")
        self.hits += 1
        log.info("restored %d of %d prompt tokens from the vaults", n, len(tokens))
        llm = self.tier.llm
        ids = np.zeros_like(llm.input_ids)
        ids[:n] = tokens[:n]
        # one row of zeros broadcasts over the restored rows; the last prompt token is always evaluated
        # again, so no logit of these rows is ever read
        scores = np.zeros((1, llm.n_vocab()), np.single)
        return LlamaState(ids, scores, n, data, len(data), llm._seed)

    def __setitem__(self, key: Sequence[int], value: Any) -> None:
        try:
            self.tier.store_state(value.input_ids[: value.n_tokens], value.llama_state)
        except Exception:  # a store must never break the call that produced it
            log.exception("storing a llama.cpp state failed")


__all__ = ["TieredLlamaCache"]
