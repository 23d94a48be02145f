"""Random-weight llama GGUFs for the llama.cpp tier, and the greedy reference runs they are checked against.

A run evaluates a prompt (or, after a restore, the rest of it) and then ``steps`` greedy tokens, keeping
the logits of every step: two runs are the same only when every token and every logit is bit-identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import llama_cpp
import numpy as np

from tierkv.connectors.llamacpp.randmodel import RandomLlama, write_gguf

SIZES = {
    "tiny": RandomLlama(layers=2, hidden=64, heads=2, kv_heads=1, ff=128),  # head dim 32: whole q8_0 blocks
    "small": RandomLlama(layers=4, hidden=256, heads=8, kv_heads=4, ff=512, seed=1),
}
KV_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}


def model_file(root: Path, size: str) -> Path:
    """The GGUF of ``size`` under ``root`` (written once)."""
    path = root / f"{size}.gguf"
    if not path.exists():
        write_gguf(path, SIZES[size])
    return path


def make_llm(path: Path, *, flash: bool = True, kv: str = "f16", n_ctx: int = 512, **extra: Any) -> Any:
    """A ``Llama`` over ``path``; ``kv`` is the K type and, with flash attention, the V type too (llama.cpp
    quantizes V only with flash attention)."""
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_batch=512,
        n_threads=2,
        flash_attn=flash,
        type_k=KV_TYPES[kv],
        type_v=KV_TYPES[kv] if flash else llama_cpp.GGML_TYPE_F16,
        seed=0,
        verbose=False,
        **extra,
    )


class Run(NamedTuple):
    tokens: list[int]
    logits: list[np.ndarray[Any, Any]]

    def same_as(self, other: Run) -> bool:
        return self.tokens == other.tokens and all(
            np.array_equal(a, b) for a, b in zip(self.logits, other.logits, strict=True)
        )


def last_logits(llm: Any) -> np.ndarray[Any, Any]:
    row = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).copy()


def greedy(llm: Any, rest: Sequence[int], steps: int = 6) -> Run:
    """Evaluate ``rest`` after what the context holds, then ``steps`` greedy tokens."""
    llm.eval(list(rest))
    tokens, logits = [], []
    for _ in range(steps):
        logits.append(last_logits(llm))
        tokens.append(int(np.argmax(logits[-1])))
        llm.eval([tokens[-1]])
    return Run(tokens, logits)


def reference(
    path: Path, prompt: Sequence[int], steps: int = 6, held: Sequence[int] = (), keep: int = 0, **kw: Any
) -> Run:
    """A fresh ``Llama``'s greedy run of ``prompt`` after llama.cpp's own reuse of a prefix in memory: the
    context evaluates ``held`` (in one batch, as a writer did), keeps its first ``keep`` cells (which must
    be ``prompt``'s first tokens) and evaluates the rest of ``prompt``. ``keep=0``: a plain full eval."""
    llm = make_llm(path, **kw)
    try:
        if keep:
            assert list(held[:keep]) == list(prompt[:keep])
            greedy(llm, held, steps=0)
            llm.n_tokens = keep  # the next eval drops the cells past it, as Llama.generate's prefix match
        return greedy(llm, prompt[keep:], steps)
    finally:
        llm.close()


def prompt(length: int, seed: int = 0, vocab: int = 512) -> list[int]:
    """``length`` token ids from the filler pieces (ids past the special and byte tokens), BOS first."""
    rng = np.random.default_rng(seed)
    return [1, *(int(t) for t in rng.integers(259, vocab, length - 1))]
