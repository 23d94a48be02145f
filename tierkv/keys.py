"""Namespaces and chained block keys: what makes a stored KV block reusable, as 32 bytes.

A KV block can be reused only by the same model weights with the same KV geometry, dtype, layout,
codec, tensor/pipeline-parallel shard and tenant, and only after the very same token prefix. The
:class:`Namespace` digests the first list; :func:`block_keys` chains the second, block by block, so a
key names a whole prefix and not only its last tokens. Everything is SHA-256 over a canonical,
length-prefixed encoding with a domain tag per use, so keys are identical across processes, machines
and Python versions (Python's ``hash`` is salted per process and never used). No I/O happens here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Final

import numpy as np

logger = logging.getLogger(__name__)

KEY_LEN: Final = 32
KV_LAYOUT_VERSION: Final = 1
"""Version of the connectors' KV block layout; bump it when the tensor a blob holds changes meaning."""

_NAMESPACE_TAG: Final = b"tierkv/namespace/v1\x00"
_ROOT_TAG: Final = b"tierkv/block-root/v1\x00"
_BLOCK_TAG: Final = b"tierkv/block/v1\x00"
_ENGINE_TAG: Final = b"tierkv/engine-hash/v1\x00"
_FINGERPRINT_TAG: Final = b"tierkv/model-fingerprint/v1\x00"
_U64: Final = struct.Struct("<Q")

ROOT_KEY: Final = hashlib.sha256(_ROOT_TAG).digest()
"""Parent of the first block when no namespace or parent is given."""

KV_SHAPING_FIELDS: Final = (
    # identity beyond the name: another revision or quantization means other weights, other KV
    "model_type",
    "architectures",
    "revision",
    "_commit_hash",
    "quantization_config",
    # geometry of attention KV
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    # K is cached after RoPE: the rotary setup changes its values
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    # which layers are full, sliding or chunked attention
    "layer_types",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "attention_chunk_size",
    "full_attention_interval",
    # recurrent state of hybrid (SSM / linear-attention) models
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_n_groups",
    "ssm_state_size",
    "state_size",
    "conv_kernel",
    # the engine's block geometry
    "block_size",
)
"""Config fields that change what a KV block holds; those present go into the model fingerprint."""

_DTYPE_ALIASES: Final = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}


def canonical_dtype(dtype: object) -> str:
    """``torch.bfloat16``, ``"bf16"`` and ``"bfloat16"`` all name one dtype, hence one namespace."""
    name = str(dtype).strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


def _canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str).encode()


def model_fingerprint(config: Mapping[str, Any], *, block_size: int | None = None) -> str:
    """Hex SHA-256 of the KV-shaping fields of a model config (a plain dict, e.g. ``config.to_dict()``).

    Fields of a nested ``text_config`` (multimodal models) count too. ``block_size`` overrides the
    config's.
    """
    picked: dict[str, Any] = {k: config[k] for k in KV_SHAPING_FIELDS if k in config}
    text = config.get("text_config")
    if isinstance(text, Mapping):
        picked.update({f"text_config.{k}": text[k] for k in KV_SHAPING_FIELDS if k in text})
    if block_size is not None:
        picked["block_size"] = block_size
    return hashlib.sha256(_FINGERPRINT_TAG + _canonical_json(picked)).hexdigest()


@dataclass(frozen=True)
class Namespace:
    """Everything that must match for a stored block to be reusable. :meth:`from_config` fills it in.

    ``model`` names the weights (checkpoint path or hub id) and ``model_fingerprint`` digests the config
    fields that shape KV (see :func:`model_fingerprint`; leave it empty only when ``model`` alone pins
    the weights and geometry). ``layout`` versions or describes the connector's block layout (e.g.
    ``"hf-v1/bs16/..."``), ``tenant`` and ``salt`` separate tenants or caches that must never share
    blocks, ``extra`` carries any further identity (an engine version, a LoRA set ...).
    """

    model: str
    dtype: str
    codec: str
    layout: str | int = KV_LAYOUT_VERSION
    model_fingerprint: str = ""
    tp_rank: int = 0
    tp_world: int = 1
    tenant: str = ""
    salt: str = ""
    pp_rank: int = 0
    pp_world: int = 1
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model or not self.dtype or not self.codec:
            raise ValueError("a namespace needs a model, a dtype and a codec")
        if not 0 <= self.tp_rank < self.tp_world or not 0 <= self.pp_rank < self.pp_world:
            raise ValueError(
                f"rank out of range: tp {self.tp_rank}/{self.tp_world}, pp {self.pp_rank}/{self.pp_world}"
            )
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        object.__setattr__(self, "codec", self.codec.lower())
        object.__setattr__(self, "extra", {str(k): str(v) for k, v in self.extra.items()})

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Namespace) and self.digest == other.digest

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for logs and for :meth:`from_dict` on another process."""
        return asdict(self)

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> Namespace:
        return cls(**dict(fields))

    @cached_property
    def digest(self) -> bytes:
        """32 bytes identifying this namespace; equal on every machine for equal fields."""
        return hashlib.sha256(_NAMESPACE_TAG + _canonical_json(self.to_dict())).digest()

    @property
    def hex(self) -> str:
        return self.digest.hex()

    @property
    def root_key(self) -> bytes:
        """Parent of the first block of every chain in this namespace."""
        return hashlib.sha256(_ROOT_TAG + self.digest).digest()

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        *,
        model: str | None = None,
        dtype: object = None,
        codec: str = "raw",
        block_size: int | None = None,
        layout: str | int = KV_LAYOUT_VERSION,
        tp_rank: int = 0,
        tp_world: int = 1,
        pp_rank: int = 0,
        pp_world: int = 1,
        tenant: str = "",
        salt: str = "",
        extra: Mapping[str, str] | None = None,
    ) -> Namespace:
        """Build a namespace from a plain config dict (an HF ``config.to_dict()`` or tierkv's own).

        ``model`` defaults to the config's ``model``/``_name_or_path``/``name_or_path``; ``dtype`` to its
        ``kv_cache_dtype`` (unless ``auto``), ``dtype`` or ``torch_dtype``.
        """
        name = model or config.get("model") or config.get("_name_or_path") or config.get("name_or_path")
        if not name:
            raise ValueError("cannot name the model: pass model= or put 'model' in the config")
        kv_dtype = config.get("kv_cache_dtype")
        kv_dtype = None if kv_dtype in (None, "auto") else kv_dtype
        chosen = dtype or kv_dtype or config.get("dtype") or config.get("torch_dtype")
        if not chosen:
            raise ValueError("cannot tell the KV dtype: pass dtype= or put 'dtype' in the config")
        return cls(
            model=str(name),
            model_fingerprint=model_fingerprint(config, block_size=block_size),
            dtype=canonical_dtype(chosen),
            codec=codec,
            layout=layout,
            tp_rank=tp_rank,
            tp_world=tp_world,
            tenant=tenant,
            salt=salt,
            pp_rank=pp_rank,
            pp_world=pp_world,
            extra=dict(extra or {}),
        )


def namespace_from_config(config: Mapping[str, Any], **kwargs: Any) -> Namespace:
    """Functional spelling of :meth:`Namespace.from_config`."""
    return Namespace.from_config(config, **kwargs)


def _check_key(name: str, key: bytes) -> bytes:
    if not isinstance(key, (bytes, bytearray, memoryview)) or len(key) != KEY_LEN:
        raise ValueError(f"{name} must be {KEY_LEN} bytes")
    return bytes(key)


def block_keys(
    token_ids: Sequence[int] | np.ndarray[Any, Any],
    block_size: int,
    *,
    extra: bytes = b"",
    parent: bytes | None = None,
    namespace: Namespace | None = None,
) -> list[bytes]:
    """One 32-byte key per FULL block of ``token_ids``; a trailing partial block gets none.

    ``key(i) = SHA-256(tag, key(i-1), len, tokens of block i as little-endian int64, len, extra)``, the
    first parent being ``parent`` (to continue a chain), else ``namespace.root_key``, else a fixed root.
    ``extra`` (LoRA id, multimodal hashes ...) is folded into every block.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    tokens = np.asarray(token_ids)
    if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in ("i", "u")):
        raise ValueError(
            f"token_ids must be a flat sequence of integers, got {tokens.dtype}{list(tokens.shape)}"
        )
    if tokens.dtype.kind == "u" and tokens.size and int(tokens.max()) > np.iinfo(np.int64).max:
        raise ValueError("token ids must fit in int64")
    full = tokens.size // block_size
    packed = tokens[: full * block_size].astype("<i8").tobytes()
    prev = (
        _check_key("parent", parent)
        if parent is not None
        else (namespace.root_key if namespace is not None else ROOT_KEY)
    )
    span = 8 * block_size
    head = _U64.pack(block_size)
    tail = _U64.pack(len(extra)) + bytes(extra)
    keys: list[bytes] = []
    for i in range(full):
        h = hashlib.sha256(_BLOCK_TAG)
        h.update(prev)
        h.update(head)
        h.update(packed[i * span : (i + 1) * span])
        h.update(tail)
        prev = h.digest()
        keys.append(prev)
    return keys


def wrap_engine_hashes(namespace: Namespace, hashes: Sequence[bytes | bytearray | memoryview]) -> list[bytes]:
    """Move an engine's own chained block hashes (vLLM ``request.block_hashes``) into our keyspace.

    Engine hashes cover tokens and extra keys but not model, dtype, rank or tenant: the namespace
    digest is hashed in. Only ``bytes`` are accepted: integer hashes usually come from Python's salted
    ``hash`` and would differ between processes.
    """
    digest = namespace.digest
    out: list[bytes] = []
    for h in hashes:
        if not isinstance(h, (bytes, bytearray, memoryview)):
            raise TypeError(f"engine block hashes must be bytes, got {type(h).__name__}")
        raw = bytes(h)
        out.append(hashlib.sha256(_ENGINE_TAG + digest + _U64.pack(len(raw)) + raw).digest())
    return out
