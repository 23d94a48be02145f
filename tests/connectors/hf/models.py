"""Tiny random-initialised transformers models for the connector tests (no download).

``initializer_range=0.2`` makes logits spread widely, so greedy argmax is stable under the tiny float
differences between a full prefill and a chunked or restored one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import transformers as tf

VOCAB = 128
_BASE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
}
_MAMBA2: dict[str, Any] = {
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_d_state": 16,
    "mamba_n_groups": 1,
    "mamba_expand": 2,
}

FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("Llama", {"num_hidden_layers": 2}),
    "qwen2": ("Qwen2", {"num_hidden_layers": 2}),
    "qwen3": ("Qwen3", {"num_hidden_layers": 2, "head_dim": 32}),
    "mistral": ("Mistral", {"num_hidden_layers": 2, "sliding_window": 32}),
    "qwen3_next": (
        "Qwen3Next",
        {
            "head_dim": 16,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
    ),
    "granitemoehybrid": (
        "GraniteMoeHybrid",
        {
            "layer_types": ["mamba", "attention", "mamba", "attention"],
            **_MAMBA2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "shared_intermediate_size": 64,
        },
    ),
    "falcon_h1": (
        "FalconH1",
        {
            "num_hidden_layers": 3,
            "head_dim": 16,
            "mamba_d_ssm": 64,
            "mamba_n_heads": 4,
            "mamba_d_head": 16,
            "mamba_d_state": 16,
            "mamba_n_groups": 1,
        },
    ),
    "zamba2": (
        "Zamba2",
        {
            "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
            "num_key_value_heads": 4,
            "attention_head_dim": 16,
            "mamba_d_state": 16,
            "mamba_headdim": 16,
            "n_mamba_heads": 8,
            "mamba_ngroups": 1,
            "mamba_expand": 2,
        },
    ),
    "lfm2": ("Lfm2", {"layer_types": ["conv", "full_attention", "conv", "full_attention"]}),
    "nemotron_h": (
        "NemotronH",
        {
            "head_dim": 16,
            "hybrid_override_pattern": "M*M-",
            "mamba_num_heads": 4,
            "mamba_head_dim": 16,
            "ssm_state_size": 16,
            "n_groups": 1,
            "expand": 1,
        },
    ),
    "bamba": ("Bamba", {"attn_layer_indices": [1, 3], **_MAMBA2}),
    "jamba": (
        "Jamba",
        {
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 2,
            "mamba_d_state": 8,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_dt_rank": 8,
            "use_mamba_kernels": False,
        },
    ),
}
"""Family -> (transformers class prefix, its settings on top of the shared tiny shape)."""
ATTENTION_FAMILIES = ("llama", "qwen2", "qwen3")
SLOW_FAMILIES = ("qwen3_next", "granitemoehybrid")
"""Their recurrent kernels run as torch reference code on CPU: a few times slower than the rest."""
HYBRID_FAMILIES = ("qwen3_next", "granitemoehybrid", "falcon_h1")
MORE_HYBRID_FAMILIES = ("zamba2", "lfm2", "nemotron_h", "bamba")


def family_params(families: Sequence[str]) -> list[Any]:
    """``pytest.param`` per family, the slow ones marked ``slow``."""
    import pytest

    return [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FAMILIES else f for f in families]


def tiny_config(family: str, **overrides: Any) -> Any:
    """The transformers config of ``family``'s tiny model, with ``overrides`` on top."""
    prefix, settings = FAMILIES[family]
    return getattr(tf, f"{prefix}Config")(**{**_BASE, **settings, **overrides})


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> Any:
    """A tiny random-init model of ``family`` in eval mode (``overrides`` change its config)."""
    torch.manual_seed(seed)
    config = tiny_config(family, **overrides)
    return getattr(tf, f"{FAMILIES[family][0]}ForCausalLM")(config).to(dtype).eval()


def tiny_llama(vocab_size: int, seed: int = 0) -> Any:
    """A tiny Llama with a given vocabulary (to pair with a tokenizer trained by a test)."""
    return tiny_model("llama", seed, vocab_size=vocab_size)


def prompt(length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, length), generator=g)


def reference(model: Any, ids: torch.Tensor, new: int) -> torch.Tensor:
    """Greedy output of a plain full prefill (no tierkv involved)."""
    with torch.no_grad():
        out: torch.Tensor = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False
        )
    return out


BAKERY = """System: You are a helpful assistant for a small bakery.
User: What bread do you bake on Mondays?
Assistant: On Mondays we bake sourdough, rye and a seeded loaf.
User: Do you have gluten free options?
Assistant: Yes, we bake a gluten free loaf on Wednesdays and Fridays.
User: When do you open?
Assistant: We open at seven and close when the bread is gone.
"""


def bakery_tokenizer() -> Any:
    """A real byte-level BPE tokenizer (``tokenizers``), trained here on :data:`BAKERY`: no download."""
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([BAKERY * 20], trainer)
    return tok
