"""What one ``generate`` call did, and the streamer that times its first token."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tierkv.connectors.hf.plan import RestorePlan
from tierkv.tiering import Restored


@dataclass
class GenerationStats:
    """What one ``generate`` call did. Token counts refer to the prompt; times are seconds.

    ``hot_hits`` / ``cold_hits`` are prompt tokens restored from the hot tier / the vaults;
    ``network_s``, ``codec_s`` and ``inject_s`` split the restore into vault calls, blob decoding and
    building the cache; ``ttft_s`` runs from the call to the first generated token.
    """

    prompt_tokens: int = 0
    restored_tokens: int = 0
    computed_tokens: int = 0
    generated_tokens: int = 0
    hot_hits: int = 0
    cold_hits: int = 0
    cold_blocks: int = 0
    rejected_blobs: int = 0
    bytes_fetched: int = 0
    source: str = "none"
    ttft_s: float = 0.0
    total_s: float = 0.0
    plan_s: float = 0.0
    network_s: float = 0.0
    codec_s: float = 0.0
    inject_s: float = 0.0
    text_match: str | None = None
    reused_text_tokens: int = 0

    @property
    def restore_s(self) -> float:
        return self.plan_s + self.network_s + self.codec_s + self.inject_s

    def fetched(self, got: Restored) -> None:
        """Count one pipeline restore (a get and its decoding)."""
        self.network_s += got.get_s
        self.codec_s += got.decode_s
        self.bytes_fetched += got.fetched_bytes
        self.rejected_blobs += got.rejected

    def planned(self, plan: RestorePlan) -> None:
        """Take the token counts of the final plan."""
        self.restored_tokens = plan.restored
        self.computed_tokens = plan.computed
        self.source = plan.source
        self.hot_hits = plan.hot_tokens
        self.cold_hits = plan.cold_tokens
        self.cold_blocks = plan.cold_blocks


class StepObserver:
    """A generate streamer that notes when the first new token arrives and reports each step.

    ``generate`` calls ``put`` once with the prompt and then once per new token, after the forward
    pass that produced it; at the k-th token the cache therefore covers ``prompt_len + k - 1``
    tokens, which ``on_step`` receives. Values are passed on to the caller's streamer, if any.
    """

    def __init__(self, inner: Any | None, prompt_len: int, on_step: Callable[[int], None] | None) -> None:
        self.inner = inner
        self.prompt_len = prompt_len
        self.on_step = on_step
        self.calls = 0
        self.first_at: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_at = time.perf_counter()
        if self.calls >= 2 and self.on_step is not None:
            self.on_step(self.prompt_len + self.calls - 2)
        if self.inner is not None:
            self.inner.put(value)

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()


__all__ = ["GenerationStats", "StepObserver"]
