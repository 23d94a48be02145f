"""Time to first token with an mlx-lm model: full prefill vs hot hit vs cold restore (``tierkv bench mlx``).

A random-weight llama of the chosen size (built in code: the FLOPs and the KV bytes are a real model's,
the words are noise). For each prompt length, ``repeats`` fresh prompts:

1. **prefill**: ``generate_step`` over the whole prompt in a fresh cache, to the first token;
2. **hot hit**: mlx-lm's own in-memory reuse — a deep copy of a cache holding all but the last token
   (what ``LRUPromptCache.fetch_nearest_cache`` hands out), then the last token;
3. the prompt is stored in the vaults through :meth:`MlxTier.prepare` / :meth:`MlxTier.store` (not timed);
4. **cold restore**: :meth:`MlxTier.prepare` (lookup, get, verify, decode, inject) and the rest of the
   prompt, to the first token; its time splits into network, codec and inject shares.

Every cold restore must give the first token of the full prefill (``ok``); the timings are reported,
never asserted.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from rich.console import Console

from tierkv.bench.ttft import TTFTResult, TTFTRow
from tierkv.connectors.mlx.hook import MlxTier
from tierkv.tiering.storage import Storage


@dataclass(frozen=True)
class MlxBenchSettings:
    lengths: tuple[int, ...]
    repeats: int = 2
    block_size: int = 16
    codec: str = "raw"
    layers: int = 8
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 2
    dtype: str = "bfloat16"
    sliding_window: int = 0
    """0: every layer full attention; else every other layer is a sliding window of this many tokens."""
    seed: int = 0


def build_model(settings: MlxBenchSettings) -> tuple[Any, str]:
    """The random-weight llama the run measures, and a one-line description of it."""
    mx.random.seed(settings.seed)
    sliding = settings.sliding_window > 0
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=settings.hidden,
        num_hidden_layers=settings.layers,
        intermediate_size=settings.hidden * 3,
        num_attention_heads=settings.heads,
        num_key_value_heads=settings.kv_heads,
        rms_norm_eps=1e-5,
        vocab_size=4096,
        layer_types=[("sliding_attention", "full_attention")[i % 2] for i in range(settings.layers)]
        if sliding
        else None,
        sliding_window=settings.sliding_window if sliding else None,
    )
    model = llama.Model(args)
    model.set_dtype(getattr(mx, settings.dtype))
    mx.eval(model.parameters())
    desc = f"llama {settings.layers}L h{settings.hidden} kv{settings.kv_heads} {settings.dtype}"
    return model, desc + (f" window {settings.sliding_window}" if sliding else "")


def first_token(model: Any, tokens: Sequence[int], cache: list[Any]) -> int:
    tok, _ = next(generate_step(mx.array(list(tokens)), model, prompt_cache=cache, max_tokens=1))
    return int(tok)


def measure_prompt(model: Any, tier: MlxTier, ids: list[int]) -> TTFTRow:
    """The three TTFTs of one prompt (see the module docstring)."""
    hot_cache = make_prompt_cache(model)
    model(mx.array(ids[:-1])[None], cache=hot_cache)
    mx.eval([c.state for c in hot_cache])
    t = time.perf_counter()
    cache = make_prompt_cache(model)
    reference = first_token(model, ids, cache)
    prefill_s = time.perf_counter() - t
    t = time.perf_counter()
    hot = first_token(model, ids[-1:], copy.deepcopy(hot_cache))
    hot_s = time.perf_counter() - t
    # Stored the way a generate user stores (snapshots at block boundaries for windowed layers), untimed.
    writer = tier.prepare(ids)
    first_token(model, writer.tokens[writer.processed :], writer.cache)
    tier.store(writer)
    t = time.perf_counter()
    prepared = tier.prepare(ids)
    cold = first_token(model, prepared.tokens[prepared.processed :], prepared.cache)
    cold_s = time.perf_counter() - t
    parts = {"network": prepared.get_s, "codec": prepared.decode_s, "inject": prepared.inject_s}
    return TTFTRow(
        len(ids),
        prefill_s,
        hot_s,
        cold_s,
        prepared.restored,
        prepared.fetched_bytes,
        parts,
        identical=cold == reference == hot and prepared.restored > 0,
    )


def run_mlx(storage: Storage, settings: MlxBenchSettings, console: Console) -> TTFTResult:
    """Build the model, warm it up, and time every prompt of the sweep over ``storage``."""
    model, desc = build_model(settings)
    parts = ("network", "codec", "inject")
    result = TTFTResult("mlx", dataclasses.asdict(settings), desc, parts, "the full prefill's first token")
    tier = MlxTier(model, storage, block_size=settings.block_size, codec=settings.codec)
    rng = np.random.default_rng(settings.seed)
    first_token(model, [1, 2, 3], make_prompt_cache(model))  # compile and allocate outside the timings
    for length in settings.lengths:
        for _ in range(settings.repeats):
            with console.status(f"{desc}: {length} tokens ..."):
                result.rows.append(measure_prompt(model, tier, rng.integers(0, 4096, length).tolist()))
    result.finish()
    return result


__all__ = ["MlxBenchSettings", "build_model", "measure_prompt", "run_mlx"]
