"""Time to first token with llama.cpp: full prefill vs hot hit vs cold restore (``tierkv bench llamacpp``).

A random-weight llama GGUF of the chosen size (written in code: the FLOPs and KV bytes are a real
model's, the words are noise), one ``Llama``. For each prompt length, ``repeats`` fresh prompts:

1. **prefill**: the whole prompt evaluated in an empty context, to the first token's logits;
2. its blocks are stored through :meth:`LlamaTier.store` (not timed);
3. **hot hit**: llama.cpp's own reuse of the prefix held in memory — the context keeps the whole blocks
   short of the last token (what a restore gives) and evaluates the rest;
4. **cold restore**: the context emptied, :meth:`LlamaTier.restore` (lookup, get, verify, rebuild, load)
   and the same rest evaluated; its time splits into network (lookup and get), load (rebuild and
   ``llama_state_seq_set_data``) and compute.

Every cold restore must give the hot hit's logits bit for bit and the prefill's first token (``ok``;
with flash attention a one-batch prefill differs from a split one in the low bits); timings are
reported, never asserted.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from rich.console import Console

from tierkv.bench.ttft import TTFTResult, TTFTRow
from tierkv.connectors.llamacpp.hook import LlamaTier
from tierkv.connectors.llamacpp.randmodel import RandomLlama, write_gguf
from tierkv.errors import BenchError
from tierkv.tiering.storage import Storage

KV_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}


@dataclass(frozen=True)
class LlamaBenchSettings:
    lengths: tuple[int, ...]
    repeats: int = 2
    block_size: int = 16
    layers: int = 8
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 2
    kv: str = "f16"
    flash_attn: bool = True
    threads: int = 2
    seed: int = 0


def first_logits(llm: Any, rest: Sequence[int]) -> np.ndarray[Any, Any]:
    """Evaluate ``rest`` after what the context holds; the logits of its last token."""
    llm.eval(list(rest))
    row = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).copy()


def measure_prompt(llm: Any, tier: LlamaTier, ids: list[int]) -> TTFTRow:
    """The three TTFTs of one prompt (see the module docstring)."""
    llm.reset()
    t = time.perf_counter()
    full = first_logits(llm, ids)
    prefill_s = time.perf_counter() - t
    tier.store()
    tier.flush()
    held = tier.reachable(len(ids)) * tier.block_size
    llm.n_tokens = held  # llama.cpp's own reuse of the prefix a restore gives: the next eval drops the rest
    t = time.perf_counter()
    hot = first_logits(llm, ids[held:])
    hot_s = time.perf_counter() - t
    llm.reset()
    t = time.perf_counter()
    got = tier.restore(ids)
    cold = first_logits(llm, ids[got.tokens :])
    cold_s = time.perf_counter() - t
    network = got.lookup_s + got.get_s
    parts = {"network": network, "load": got.load_s, "compute": cold_s - network - got.load_s}
    identical = got.tokens == held > 0 and np.array_equal(cold, hot) and np.argmax(cold) == np.argmax(full)
    return TTFTRow(len(ids), prefill_s, hot_s, cold_s, got.tokens, got.fetched_bytes, parts, identical)


def run_llamacpp(storage: Storage, settings: LlamaBenchSettings, console: Console) -> TTFTResult:
    """Write the model, load it, warm it up, and time every prompt of the sweep over ``storage``."""
    shape = RandomLlama(
        layers=settings.layers,
        hidden=settings.hidden,
        heads=settings.heads,
        kv_heads=settings.kv_heads,
        ff=settings.hidden * 3,
        vocab=4096,
        context=-(-(max(settings.lengths) + 64) // 256) * 256,  # llama.cpp rounds n_ctx up to 256
        seed=settings.seed,
    )
    head_dim = settings.hidden // settings.heads
    if settings.kv != "f16" and head_dim % 32:
        raise BenchError(
            f"--kv {settings.kv} needs a head dim that is a multiple of 32, --hidden gives {head_dim}"
        )
    desc = f"{shape.describe()}, KV {settings.kv}, flash attention {'on' if settings.flash_attn else 'off'}"
    check = "the hot hit's logits and the prefill's first token"
    result = TTFTResult("llamacpp", dataclasses.asdict(settings), desc, ("network", "load", "compute"), check)
    with tempfile.TemporaryDirectory(prefix="tierkv-bench-gguf-") as tmp:
        llm = llama_cpp.Llama(
            model_path=str(write_gguf(Path(tmp) / "bench.gguf", shape)),
            n_ctx=shape.context,
            n_batch=min(shape.context, 2048),
            n_threads=settings.threads,
            flash_attn=settings.flash_attn,
            type_k=KV_TYPES[settings.kv],
            type_v=KV_TYPES[settings.kv] if settings.flash_attn else llama_cpp.GGML_TYPE_F16,
            verbose=False,
        )
        tier = LlamaTier(llm, storage, block_size=settings.block_size)
        try:
            rng = np.random.default_rng(settings.seed)
            first_logits(llm, [1, 300, 301])  # allocate outside the timings
            for length in settings.lengths:
                for _ in range(settings.repeats):
                    ids = [1, *(int(t) for t in rng.integers(259, shape.vocab, length - 1))]
                    with console.status(f"{desc}: {length} tokens ..."):
                        result.rows.append(measure_prompt(llm, tier, ids))
        finally:
            tier.close()
            llm.close()
    result.finish()
    return result


__all__ = ["LlamaBenchSettings", "first_logits", "measure_prompt", "run_llamacpp"]
