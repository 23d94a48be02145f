"""Synthetic llama.cpp KV states, written field by field in the order of llama.cpp's ``state_write``.

An oracle independent of the codec under test: it writes the bytes the way ``llama_kv_cache::state_write``
(``src/llama-kv-cache.cpp``) does — envelope, stream counts, cell metadata, K rows per layer, then V rows
or transposed V — from per-layer arrays a test can compare with what the codec parsed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

MAGIC = 0xAF143CD8
TYPE_BYTES = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 12: (256, 144)}
"""ggml type id → (values per block, bytes per block); 12 (q4_K) is not a KV cache type."""


@dataclass
class Synthetic:
    """A state of ``cells`` cells: K rows per layer, V rows (or transposed V) per layer."""

    cells: int
    k: list[npt.NDArray[np.uint8]]
    v: list[npt.NDArray[np.uint8]]
    k_type: int
    v_type: int
    v_trans: bool
    positions: list[int]
    seq_id: int = 0
    seq_ids: list[list[int]] = field(default_factory=list)


def make(
    cells: int,
    *,
    layers: int = 2,
    n_embd: int = 64,
    k_type: int = 1,
    v_type: int = 1,
    v_trans: bool = False,
    seed: int = 0,
    seq_id: int = 0,
) -> Synthetic:
    rng = np.random.default_rng(seed)

    def row_bytes(t: int) -> int:
        elems, size = TYPE_BYTES[t]
        return n_embd // elems * size

    k = [rng.integers(0, 256, (cells, row_bytes(k_type)), np.uint8) for _ in range(layers)]
    if v_trans:
        elem = TYPE_BYTES[v_type][1]
        v = [rng.integers(0, 256, (n_embd, cells, elem), np.uint8) for _ in range(layers)]
    else:
        v = [rng.integers(0, 256, (cells, row_bytes(v_type)), np.uint8) for _ in range(layers)]
    return Synthetic(cells, k, v, k_type, v_type, v_trans, list(range(cells)), seq_id, [[seq_id]] * cells)


def prefix(s: Synthetic, cells: int) -> Synthetic:
    """The state llama.cpp would write had only the first ``cells`` tokens been evaluated."""
    v = [a[:, :cells] for a in s.v] if s.v_trans else [a[:cells] for a in s.v]
    return Synthetic(
        cells, [a[:cells] for a in s.k], v, s.k_type, s.v_type, s.v_trans,
        s.positions[:cells], s.seq_id, s.seq_ids[:cells],
    )  # fmt: skip


def write(
    s: Synthetic,
    *,
    arch: str = "",
    n_stream: int = 1,
    stream: int = 0,
    cell_ext: bytes = b"",
    magic: int = MAGIC,
) -> bytes:
    """The bytes of ``s`` as a sequence state (or, with ``arch``, a context state), its cells in ``stream``.

    ``cell_ext`` is written after each cell's ``n_seq_id``, as llama.cpp does for M-RoPE models.
    """
    out = bytearray()
    if arch:
        out += struct.pack("<I", len(arch)) + arch.encode()
    else:
        out += struct.pack("<Ii", magic, s.seq_id)
    out += struct.pack("<I", n_stream)
    for st in range(n_stream):
        if st != stream or s.cells == 0:
            out += struct.pack("<I", 0)
            continue
        out += struct.pack("<I", s.cells)
        for pos, ids in zip(s.positions, s.seq_ids, strict=True):
            out += struct.pack("<iI", pos, len(ids)) + cell_ext
            out += b"".join(struct.pack("<i", i) for i in ids)
        out += struct.pack("<II", int(s.v_trans), len(s.k))
        for a in s.k:
            out += struct.pack("<iQ", s.k_type, a.shape[1]) + a.tobytes()
        for a in s.v:
            if s.v_trans:
                out += struct.pack("<iII", s.v_type, a.shape[2], a.shape[0]) + a.tobytes()
            else:
                out += struct.pack("<iQ", s.v_type, a.shape[1]) + a.tobytes()
    return bytes(out)
