"""A random-weight llama GGUF written in code (the ``gguf`` package): tests and ``tierkv bench llamacpp``.

The FLOPs and KV bytes are those of a real llama of that size; the words are noise. The tokenizer is a
SentencePiece (``llama``) vocabulary of ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens and filler
pieces, so any text tokenizes. Weights are float32 (``gguf`` writes them as they are).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType

_SPECIAL = ("<unk>", "<s>", "</s>")


@dataclass(frozen=True)
class RandomLlama:
    """The shape of a random llama; :meth:`describe` is a one-line summary for reports."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ff: int = 128
    vocab: int = 512
    context: int = 4096
    seed: int = 0

    def describe(self) -> str:
        return (
            f"random llama {self.layers}L d{self.hidden} h{self.heads}/kv{self.kv_heads} vocab {self.vocab}"
        )


def _vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    if size < len(_SPECIAL) + 256 + 1:
        raise ValueError(f"vocab must hold the special and byte tokens: {size} < {len(_SPECIAL) + 257}")
    pieces = list(_SPECIAL) + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [f"\u2581w{i}" for i in range(size - len(pieces))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    types += [TokenType.NORMAL] * (size - len(types))
    scores = [0.0] * (len(_SPECIAL) + 256) + [-float(i) for i in range(size - len(_SPECIAL) - 256)]
    return pieces, scores, [int(t) for t in types]


def write_gguf(path: str | Path, shape: RandomLlama = RandomLlama()) -> Path:
    """Write ``shape`` as a llama GGUF at ``path`` (weights from ``shape.seed``) and return the path."""
    path = Path(path)
    head_dim = shape.hidden // shape.heads
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(LlamaFileType.ALL_F32)
    pieces, scores, types = _vocab(shape.vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    rng = np.random.default_rng(shape.seed)

    def weight(*dims: int, scale: float = 0.0) -> np.ndarray:
        std = scale or dims[-1] ** -0.5
        return (rng.standard_normal(dims) * std).astype(np.float32)

    kv = shape.kv_heads * head_dim
    writer.add_tensor("token_embd.weight", weight(shape.vocab, shape.hidden, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(shape.hidden, np.float32))
    writer.add_tensor("output.weight", weight(shape.vocab, shape.hidden))
    for i in range(shape.layers):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(shape.hidden, np.float32))
        writer.add_tensor(f"{blk}.attn_q.weight", weight(shape.hidden, shape.hidden))
        writer.add_tensor(f"{blk}.attn_k.weight", weight(kv, shape.hidden))
        writer.add_tensor(f"{blk}.attn_v.weight", weight(kv, shape.hidden))
        writer.add_tensor(f"{blk}.attn_output.weight", weight(shape.hidden, shape.hidden))
        writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(shape.hidden, np.float32))
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(shape.ff, shape.hidden))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(shape.ff, shape.hidden))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(shape.hidden, shape.ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


__all__ = ["RandomLlama", "write_gguf"]
