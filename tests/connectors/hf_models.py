"""Tiny random-initialised transformers models for the connector tests (no download).

``initializer_range=0.2`` makes logits spread widely, so greedy argmax is stable under the tiny float
differences between a full prefill and a chunked or restored one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import transformers as tf

VOCAB = 128
COMMON: dict[str, Any] = {"vocab_size": VOCAB, "initializer_range": 0.2, "tie_word_embeddings": False}


def _llama(vocab_size: int = VOCAB) -> Any:
    cfg = tf.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **{**COMMON, "vocab_size": vocab_size},
    )
    return tf.LlamaForCausalLM(cfg)


def tiny_llama(vocab_size: int, seed: int = 0) -> Any:
    """A tiny Llama with a given vocabulary (to pair with a tokenizer trained by a test)."""
    torch.manual_seed(seed)
    return _llama(vocab_size).eval()


def _qwen2() -> Any:
    cfg = tf.Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **COMMON,
    )
    return tf.Qwen2ForCausalLM(cfg)


def _qwen3() -> Any:
    cfg = tf.Qwen3Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        **COMMON,
    )
    return tf.Qwen3ForCausalLM(cfg)


def _qwen3_next() -> Any:
    cfg = tf.Qwen3NextConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        **COMMON,
    )
    return tf.Qwen3NextForCausalLM(cfg)


def _granitemoehybrid() -> Any:
    cfg = tf.GraniteMoeHybridConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["mamba", "attention", "mamba", "attention"],
        mamba_n_heads=4,
        mamba_d_head=32,
        mamba_d_state=16,
        mamba_n_groups=1,
        mamba_expand=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=64,
        **COMMON,
    )
    return tf.GraniteMoeHybridForCausalLM(cfg)


def _falcon_h1() -> Any:
    cfg = tf.FalconH1Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=16,
        mamba_n_groups=1,
        **COMMON,
    )
    return tf.FalconH1ForCausalLM(cfg)


def _zamba2() -> Any:
    cfg = tf.Zamba2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
        num_attention_heads=4,
        num_key_value_heads=4,
        attention_head_dim=16,
        mamba_d_state=16,
        mamba_headdim=16,
        n_mamba_heads=8,
        mamba_ngroups=1,
        mamba_expand=2,
        **COMMON,
    )
    return tf.Zamba2ForCausalLM(cfg)


def _lfm2() -> Any:
    cfg = tf.Lfm2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        **COMMON,
    )
    return tf.Lfm2ForCausalLM(cfg)


def _nemotron_h() -> Any:
    cfg = tf.NemotronHConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hybrid_override_pattern="M*M-",
        mamba_num_heads=4,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=1,
        expand=1,
        **COMMON,
    )
    return tf.NemotronHForCausalLM(cfg)


def _bamba() -> Any:
    cfg = tf.BambaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_indices=[1, 3],
        mamba_n_heads=4,
        mamba_d_head=32,
        mamba_d_state=16,
        mamba_n_groups=1,
        mamba_expand=2,
        **COMMON,
    )
    return tf.BambaForCausalLM(cfg)


def _jamba() -> Any:
    cfg = tf.JambaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=8,
        use_mamba_kernels=False,
        **COMMON,
    )
    return tf.JambaForCausalLM(cfg)


FAMILIES: dict[str, Callable[[], Any]] = {
    "llama": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen3_next": _qwen3_next,
    "granitemoehybrid": _granitemoehybrid,
    "falcon_h1": _falcon_h1,
    "zamba2": _zamba2,
    "lfm2": _lfm2,
    "nemotron_h": _nemotron_h,
    "bamba": _bamba,
    "jamba": _jamba,
}
ATTENTION_FAMILIES = ("llama", "qwen2", "qwen3")
SLOW_FAMILIES = ("qwen3_next", "granitemoehybrid")
"""Their recurrent kernels run as torch reference code on CPU: a few times slower than the rest."""
HYBRID_FAMILIES = ("qwen3_next", "granitemoehybrid", "falcon_h1")
MORE_HYBRID_FAMILIES = ("zamba2", "lfm2", "nemotron_h", "bamba")


def family_params(families: Sequence[str]) -> list[Any]:
    """``pytest.param`` per family, the slow ones marked ``slow``."""
    import pytest

    return [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FAMILIES else f for f in families]


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> Any:
    """A tiny random-init model of ``family`` in eval mode."""
    torch.manual_seed(seed)
    return FAMILIES[family]().to(dtype).eval()


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
