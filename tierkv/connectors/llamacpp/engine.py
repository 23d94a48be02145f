"""What the hook needs from llama-cpp-python, in one place: version and model checks, state in and out,
the layout probe and the model's identity.

Everything here goes through llama-cpp-python's public ``Llama`` attributes and its ctypes bindings of
llama.cpp's C API (``llama_state_seq_get_data`` / ``llama_state_seq_set_data``, ``llama_decode`` …).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import llama_cpp
import numpy as np
import numpy.typing as npt

from tierkv.connectors.llamacpp.state import FORMAT, KV_TYPES, KVState, StateLayout, blocks, parse, rebuild
from tierkv.errors import UnsupportedStateError

TESTED: Final = ((0, 3, 36), (0, 4, 0))
"""llama-cpp-python releases whose state format :data:`~tierkv.connectors.llamacpp.state.FORMAT` is:
from the first (included) to the second (excluded)."""

PROBE_CTX: Final = 256
"""Context size of the scratch context the layout probe evaluates one token in."""

_FINGERPRINT_TAG: Final = b"tierkv/gguf-fingerprint/v1\x00"
_ROPE_FIELDS: Final = (
    "rope_scaling_type",
    "rope_freq_base",
    "rope_freq_scale",
    "yarn_ext_factor",
    "yarn_attn_factor",
    "yarn_beta_fast",
    "yarn_beta_slow",
    "yarn_orig_ctx",
)
"""Context parameters that change the values in K (RoPE is applied before K is cached)."""
_OTHER_ROPE: Final = frozenset(
    {llama_cpp.LLAMA_ROPE_TYPE_MROPE, llama_cpp.LLAMA_ROPE_TYPE_IMROPE, llama_cpp.LLAMA_ROPE_TYPE_VISION}
)


def version() -> str:
    return str(llama_cpp.__version__)


def check_version(found: str | None = None) -> None:
    """Refuse a llama-cpp-python outside :data:`TESTED`: its state format may differ."""
    found = found or version()
    try:
        parts = tuple(int(p) for p in found.split("+")[0].split(".")[:3])
    except ValueError:
        parts = ()
    low, high = TESTED
    if not parts or not low <= parts < high:
        span = f"{'.'.join(map(str, low))} up to (not including) {'.'.join(map(str, high))}"
        raise UnsupportedStateError(
            f"llama-cpp-python {found}: tierkv reads the KV state ({FORMAT}) of releases {span}; "
            "install one of those (pip install 'tierkv[llamacpp]')"
        )


def check_model(llm: Any) -> None:
    """Refuse models whose memory is not one full-attention KV cache of plain positions."""
    model = llm.model
    why = ""
    if llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model):
        why = "a recurrent or hybrid model (its memory holds recurrent states)"
    elif llama_cpp.llama_model_n_swa(model) > 0:
        why = f"a sliding-window model (n_swa={llama_cpp.llama_model_n_swa(model)}: a second KV cache)"
    elif llama_cpp.llama_model_rope_type(model) in _OTHER_ROPE:
        why = "an M-RoPE / vision model (its cells carry 2-D positions)"
    elif llama_cpp.llama_model_has_encoder(model):
        why = "an encoder-decoder model"
    if why:
        raise UnsupportedStateError(
            f"{llm.model_path}: {why}; the llama.cpp hook tiers full-attention KV only"
        )


def seq_state(ctx: Any, seq_id: int = 0) -> npt.NDArray[np.uint8]:
    """Sequence ``seq_id``'s state, as llama.cpp writes it, in a new array."""
    size = int(llama_cpp.llama_state_seq_get_size(ctx, seq_id))
    out = np.empty(size, np.uint8)
    written = int(
        llama_cpp.llama_state_seq_get_data(
            ctx, out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, seq_id
        )
    )
    if written != size:
        raise UnsupportedStateError(f"llama.cpp wrote {written} of {size} bytes of sequence {seq_id}'s state")
    return out


def load_seq_state(ctx: Any, data: bytes, seq_id: int = 0) -> bool:
    """Load a sequence state into ``seq_id``; False (and the sequence empty) when llama.cpp refused it."""
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    return int(llama_cpp.llama_state_seq_set_data(ctx, buf, len(data), seq_id)) == len(data)


@dataclass(frozen=True)
class Probe:
    """What the layout probe learnt: the KV layout, the context's KV stream count and the architecture
    name a whole-context state starts with."""

    layout: StateLayout
    n_stream: int
    arch: str


def probe_layout(llm: Any) -> Probe:
    """The layout of ``llm``'s KV state: one token evaluated in a scratch context with its parameters.

    The probe's sequence and context states must parse and rebuild to the very bytes llama.cpp wrote;
    anything else means this llama.cpp writes a format the codec does not read, and the hook refuses to
    start.
    """
    params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
    params.n_ctx = PROBE_CTX
    params.n_batch = params.n_ubatch = 8
    ctx = llama_cpp.llama_init_from_model(llm.model, params)
    if not ctx:
        raise UnsupportedStateError("llama.cpp could not create the scratch context of the layout probe")
    try:
        bos = int(llm.token_bos())
        token = (llama_cpp.llama_token * 1)(max(bos, 0))
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(token, 1)) != 0:
            raise UnsupportedStateError("llama.cpp could not evaluate the layout probe's token")
        seq, whole = seq_state(ctx, 0), _context_state(ctx)
    finally:
        llama_cpp.llama_free(ctx)
    found = [_reproduced(seq, 0), _reproduced(whole, None)]
    if found[0].layout != found[1].layout or found[0].envelope.n_stream != found[1].envelope.n_stream:
        raise UnsupportedStateError("the layout probe's sequence and context states disagree")
    layout = found[0].layout
    assert layout is not None  # _reproduced checked it
    return Probe(layout, found[0].envelope.n_stream, found[1].envelope.arch)


def _context_state(ctx: Any) -> npt.NDArray[np.uint8]:
    size = int(llama_cpp.llama_state_get_size(ctx))
    out = np.empty(size, np.uint8)
    written = int(
        llama_cpp.llama_state_get_data(ctx, out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size)
    )
    if written != size:
        raise UnsupportedStateError(f"llama.cpp wrote {written} of {size} bytes of the context state")
    return out


def _reproduced(data: npt.NDArray[np.uint8], seq_id: int | None) -> KVState:
    """``data`` parsed, after checking that it holds one cell and rebuilds to the same bytes."""
    state = parse(data, seq_id=seq_id)
    if state.layout is None or state.cells != 1:
        raise UnsupportedStateError(f"the layout probe's state holds {state.cells} cells, expected 1")
    if rebuild(state.layout, list(blocks(state, 1)), 1, state.envelope) != data.tobytes():
        raise UnsupportedStateError("the layout probe's state does not rebuild to llama.cpp's own bytes")
    return state


def file_fingerprint(path: str | os.PathLike[str], samples: int = 16, chunk: int = 1 << 16) -> str:
    """SHA-256 of a model file's size, first MiB (GGUF header, metadata, tensor table) and ``samples``
    chunks spread over the rest: the same weights, cheaply, without reading a 40 GB file."""
    size = os.path.getsize(path)
    h = hashlib.sha256(_FINGERPRINT_TAG + size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        for i in range(samples):
            f.seek(size * i // samples)
            h.update(f.read(chunk))
    return h.hexdigest()


def identity(llm: Any) -> dict[str, Any]:
    """What, besides the weights' file, changes the KV a model writes: its GGUF metadata, the RoPE
    parameters of the context, a LoRA adapter and its scale."""
    params = llm.context_params
    found: dict[str, Any] = {"metadata": dict(sorted(_strings(llm.metadata).items()))}
    found["rope"] = {name: getattr(params, name) for name in _ROPE_FIELDS}
    if llm.lora_path:
        found["lora"] = {"file": file_fingerprint(llm.lora_path), "scale": llm.lora_scale}
    return found


def _strings(metadata: Mapping[Any, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in metadata.items()}


def kv_types(layout: StateLayout) -> str:
    """``k=<type>,v=<type>`` of the layout (the namespace's dtype), every layer's type named."""
    k = sorted({KV_TYPES[s.ggml_type].name for s in layout.k})
    v = sorted({KV_TYPES[s.ggml_type].name for s in layout.v})
    return f"k={'+'.join(k)},v={'+'.join(v)}"


def fingerprint(llm: Any) -> str:
    """Hex digest of :func:`identity`."""
    blob = json.dumps(identity(llm), sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


__all__ = [
    "PROBE_CTX",
    "TESTED",
    "Probe",
    "check_model",
    "check_version",
    "file_fingerprint",
    "fingerprint",
    "identity",
    "kv_types",
    "load_seq_state",
    "probe_layout",
    "seq_state",
    "version",
]
