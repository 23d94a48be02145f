"""Tiny random-weight mlx-lm models built in code (no download) and the reference runs checked against."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.generate import generate_step
from mlx_lm.models import llama, mamba, qwen2, qwen3_next

VOCAB = 256
FAMILIES = ("llama", "llama_swa", "qwen3_next", "mamba")


def _llama(sliding: bool, heads: int = 4) -> Any:
    layers = ["sliding_attention", "full_attention"] * 2 if sliding else None
    return llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=64,
            num_hidden_layers=4,
            intermediate_size=128,
            num_attention_heads=heads,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            vocab_size=VOCAB,
            layer_types=layers,
            sliding_window=24 if sliding else None,
        )
    )


def _qwen2() -> Any:
    # No make_cache of its own (unlike llama): engines that build their own caches, such as EXO with
    # KV_CACHE_BITS, quantize its layers. head_dim 32, the smallest mx.quantize group size.
    return qwen2.Model(
        qwen2.ModelArgs(
            model_type="qwen2",
            hidden_size=64,
            num_hidden_layers=4,
            intermediate_size=128,
            num_attention_heads=2,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            vocab_size=VOCAB,
        )
    )


def _qwen3_next() -> Any:
    # fp32: on the CPU backend MoE GatherMM runs only in float32.
    return qwen3_next.Model(
        qwen3_next.ModelArgs(
            model_type="qwen3_next",
            hidden_size=64,
            num_hidden_layers=4,
            intermediate_size=128,
            num_attention_heads=4,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            shared_expert_intermediate_size=64,
            mlp_only_layers=[],
            moe_intermediate_size=32,
            rms_norm_eps=1e-6,
            vocab_size=VOCAB,
            num_key_value_heads=2,
            rope_theta=10000.0,
            partial_rotary_factor=0.25,
            max_position_embeddings=512,
            head_dim=16,
            full_attention_interval=2,
        )
    )


def _mamba() -> Any:
    return mamba.Model(
        mamba.ModelArgs(
            model_type="mamba",
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            state_size=8,
            num_hidden_layers=2,
            conv_kernel=4,
            use_bias=False,
            use_conv_bias=True,
            time_step_rank=8,
        )
    )


@cache
def tiny_model(family: str, dtype: str = "float32") -> Any:
    """A random model (seeded), its weights scaled up so greedy decoding does not repeat one token."""
    mx.random.seed(7)
    builders: dict[str, Callable[[], Any]] = {
        "llama": lambda: _llama(False),
        "llama_swa": lambda: _llama(True),
        # head_dim 32: the smallest mx.quantize group size, for QuantizedKVCache layers
        "llama_hd32": lambda: _llama(False, heads=2),
        "qwen2_hd32": _qwen2,
        "qwen3_next": _qwen3_next,
        "mamba": _mamba,
    }
    model = builders[family]()
    weights = [
        (k, (v * 4 if v.ndim == 2 else v).astype(getattr(mx, dtype)))
        for k, v in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(weights))
    mx.eval(model.parameters())
    return model


def prompt(length: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, length).tolist()


class Run(NamedTuple):
    """Greedy tokens and the log-probabilities each was picked from."""

    tokens: list[int]
    logprobs: list[np.ndarray]

    def same_as(self, other: Run) -> bool:
        """Bit-identical: same tokens and the same logits bits at every step."""
        return self.tokens == other.tokens and all(
            a.dtype == b.dtype and a.tobytes() == b.tobytes()
            for a, b in zip(self.logprobs, other.logprobs, strict=True)
        )


def run(model: Any, tokens: Sequence[int], cache: list[Any] | None = None, new: int = 8) -> Run:
    """Greedy generation with mlx-lm's own ``generate_step`` (a fresh cache unless one is given)."""
    out: list[int] = []
    lps: list[np.ndarray] = []
    steps = generate_step(mx.array(list(tokens)), model, prompt_cache=cache, max_tokens=new)
    for tok, lp in steps:
        out.append(int(tok))
        lps.append(np.array(lp.astype(mx.float32)))
    return Run(out, lps)


def save_model(family: str, path: Path) -> Path:
    """Write :func:`tiny_model` as an mlx-lm model directory (config, weights, word-level tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = tiny_model(family)
    path.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in asdict(model.args).items() if v is not None}
    (path / "config.json").write_text(json.dumps(config))
    model.save_weights(str(path / "model.safetensors"))
    # "t2z", not "t2": special tokens are matched inside words ("t217" would start with "t2").
    tokenizer = Tokenizer(models.WordLevel(vocab={f"t{i}z": i for i in range(VOCAB)}, unk_token="t0z"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path / "tokenizer.json"))
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0z", "eos_token": "t2z"}
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return path


def as_text(tokens: Sequence[int]) -> str:
    return " ".join(f"t{t}z" for t in tokens)
