"""KV geometry of real models, so synthetic workloads move the bytes a real deployment would.

A shape gives, per token, the bytes of attention KV (to ``kv_cold``) and, for hybrid models, the size of the
recurrent state snapshot taken at each block boundary (to ``ssm_cold``). Shapes that ``tierkv bench hf``
can instantiate as random-weight transformers models also carry the rest of the architecture
(:class:`HFArch`), so the prefill it measures costs the FLOPs the real model would.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclasses.dataclass(frozen=True)
class HFArch:
    """What a transformers config needs beyond the KV geometry (``family``: ``llama`` or ``qwen2``)."""

    family: str
    hidden_size: int
    intermediate_size: int
    attention_heads: int
    vocab_size: int
    tie_embeddings: bool = False


@dataclasses.dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    ssm_layers: int = 0
    ssm_state_elems: int = 0
    ssm_dtype: str = "float32"
    hf: HFArch | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * _ITEMSIZE[self.dtype]

    @property
    def ssm_bytes_per_snapshot(self) -> int:
        return self.ssm_layers * self.ssm_state_elems * _ITEMSIZE[self.ssm_dtype]

    def block_shape(self, block_tokens: int) -> tuple[int, int, int, int, int]:
        """One KV block holding every attention layer: ``[layers, K/V, kv_heads, tokens, head_dim]``."""
        return (self.layers, 2, self.kv_heads, block_tokens, self.head_dim)

    def random_block(self, block_tokens: int, rng: np.random.Generator) -> npt.NDArray[np.generic]:
        """Gaussian KV values in the shape's dtype (bf16 as its uint16 bit pattern)."""
        values = rng.standard_normal(self.block_shape(block_tokens), dtype=np.float32)
        if self.dtype == "bfloat16":
            return (values.view(np.uint32) >> 16).astype(np.uint16)
        return values.astype(self.dtype)

    def random_ssm_state(self, rng: np.random.Generator) -> npt.NDArray[np.generic]:
        return rng.standard_normal((self.ssm_layers, self.ssm_state_elems), dtype=np.float32).astype(
            self.ssm_dtype
        )


SHAPES: dict[str, ModelShape] = {
    "qwen2.5-0.5b": ModelShape(
        "qwen2.5-0.5b",
        layers=24,
        kv_heads=2,
        head_dim=64,
        hf=HFArch(
            "qwen2",
            hidden_size=896,
            intermediate_size=4864,
            attention_heads=14,
            vocab_size=151936,
            tie_embeddings=True,
        ),
    ),
    "llama3-8b": ModelShape(
        "llama3-8b",
        layers=32,
        kv_heads=8,
        head_dim=128,
        hf=HFArch("llama", hidden_size=4096, intermediate_size=14336, attention_heads=32, vocab_size=128256),
    ),
    # hybrid: 1 full-attention layer in 4; the other 30 keep a gated-delta-net state of 32 heads x 128 x 128
    # plus a short conv state, snapshotted (fp32) at block boundaries
    "qwen3.6-35b-a3b": ModelShape(
        "qwen3.6-35b-a3b",
        layers=10,
        kv_heads=2,
        head_dim=256,
        ssm_layers=30,
        ssm_state_elems=32 * 128 * 128 + 4 * 8192,
    ),
}


def parse_shape(spec: str) -> ModelShape:
    """A known name, or ``custom:LAYERS,KV_HEADS,HEAD_DIM,DTYPE``."""
    if spec in SHAPES:
        return SHAPES[spec]
    if spec.startswith("custom:"):
        parts = spec[len("custom:") :].split(",")
        if len(parts) == 4 and parts[3] in _ITEMSIZE:
            try:
                return ModelShape(
                    spec, layers=int(parts[0]), kv_heads=int(parts[1]), head_dim=int(parts[2]), dtype=parts[3]
                )
            except ValueError:
                pass
    raise ValueError(
        f"unknown shape {spec!r}: use one of {', '.join(SHAPES)} or custom:LAYERS,KV_HEADS,HEAD_DIM,DTYPE "
        f"(dtype one of {', '.join(_ITEMSIZE)})"
    )


def hf_arch(shape: ModelShape) -> HFArch:
    """The transformers architecture for a shape; ``custom:`` shapes become a Llama around their KV.

    A custom shape gets 4 query heads per KV head, ``hidden = heads x head_dim``, an MLP of 8/3 of that
    (rounded to 64) and a 32k vocabulary: a generic modern decoder with exactly the shape's KV geometry.
    Hybrid shapes have no random-weight stand-in small enough to run.
    """
    if shape.hf is not None:
        return shape.hf
    if shape.ssm_layers:
        raise ValueError(f"{shape.name} is a hybrid model: --hf runs attention-only shapes")
    heads = 4 * shape.kv_heads
    hidden = heads * shape.head_dim
    return HFArch("llama", hidden, max(64, (hidden * 8 // 3 + 63) // 64 * 64), heads, 32000)
