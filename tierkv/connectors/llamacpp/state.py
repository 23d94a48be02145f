"""llama.cpp's saved KV-cache state, parsed, cut into token blocks and rebuilt — sans-IO, numpy only.

llama.cpp writes a sequence (``llama_state_seq_get_data``) or a whole context (``llama_state_get_data``)
as an *envelope* around the KV cache's own ``state_write``:

- sequence: ``u32 magic 0xaf143cd8``, ``i32 seq_id``; context: ``u32 n`` and ``n`` bytes of the model's
  architecture name;
- ``u32 n_stream``; per stream ``u32 cell_count`` and, when it is not 0, the cells' metadata (per cell
  ``i32 pos``, ``u32 n_seq_id``, ``n_seq_id`` × ``i32 seq_id``) and their data: ``u32 v_trans``,
  ``u32 n_layer``; per layer K (``i32 ggml type``, ``u64 row bytes``, one row per cell); per layer V the
  same, or with ``v_trans`` (no flash attention) ``i32 type``, ``u32 element bytes``, ``u32 n_embd_v``
  and one run of cells per element.

The format is llama.cpp's internal one, not an API: :data:`FORMAT` names the one this module reads, and
anything else — another magic, a ggml type the KV cache does not use, a second non-empty stream, cells
of other sequences, positions that are not ``0..n-1`` in order, a byte too many or too few — is refused
with :class:`~tierkv.errors.UnsupportedStateError`, never guessed. Memories that write more than one
cache (sliding-window models write a second one; recurrent and hybrid models write recurrent states;
M-RoPE and per-layer-embedding models add fields to every cell) fail that accounting too.

A *block* is ``block_size`` consecutive cells: for each K layer its rows, then for each V layer its rows
(or, transposed, its ``n_embd_v`` runs of ``block_size`` elements), as one flat ``uint8`` array. Blocks
are copied bit for bit, so quantized KV types (``q8_0``, ``q4_0`` …) round-trip unchanged.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

from tierkv.errors import UnsupportedStateError

FORMAT: Final = "llama.cpp-kv-state/1"
"""The state layout this module reads: llama.cpp's KV cache ``state_write`` as of llama-cpp-python 0.3.36."""

SEQ_MAGIC: Final = 0xAF143CD8
"""First word of a sequence state (llama.cpp's ``io_magic``)."""

StateBytes: TypeAlias = bytes | bytearray | memoryview | npt.NDArray[np.uint8]
"""A state as llama.cpp wrote it, in any buffer (parsed arrays are views of it, never copies)."""

MAX_STREAMS: Final = 1 << 16
"""More KV streams than this is not a state llama.cpp wrote (a stream per sequence at most)."""


@dataclass(frozen=True)
class GgmlType:
    """A ggml tensor type the KV cache may hold: ``block_bytes`` per ``block_elems`` values."""

    name: str
    block_elems: int
    block_bytes: int


KV_TYPES: Final = {
    0: GgmlType("f32", 1, 4),
    1: GgmlType("f16", 1, 2),
    2: GgmlType("q4_0", 32, 18),
    3: GgmlType("q4_1", 32, 20),
    6: GgmlType("q5_0", 32, 22),
    7: GgmlType("q5_1", 32, 24),
    8: GgmlType("q8_0", 32, 34),
    20: GgmlType("iq4_nl", 32, 18),
    30: GgmlType("bf16", 1, 2),
}
"""The ggml types llama.cpp accepts for ``type_k`` / ``type_v``, by ggml type id."""

KV_TYPE_IDS: Final = {t.name: i for i, t in KV_TYPES.items()}


def kv_type(type_id: int, what: str) -> GgmlType:
    """The KV type with ggml id ``type_id``, or a refusal naming ``what`` carried it."""
    found = KV_TYPES.get(type_id)
    if found is None:
        raise UnsupportedStateError(f"{what}: ggml type {type_id} is not a KV cache type this codec knows")
    return found


@dataclass(frozen=True)
class Section:
    """One layer's K or V in a state: its ggml type and bytes per cell.

    A transposed V section (``v_trans``) holds ``n_embd`` runs of one ``elem_bytes`` element per cell.
    """

    ggml_type: int
    cell_bytes: int
    elem_bytes: int = 0
    n_embd: int = 0

    @property
    def transposed(self) -> bool:
        return self.n_embd > 0

    def describe(self) -> str:
        name = KV_TYPES[self.ggml_type].name
        return f"{name}x{self.n_embd}t" if self.transposed else f"{name}:{self.cell_bytes}"


@dataclass(frozen=True)
class StateLayout:
    """What a cell of one model's KV state holds: per layer a K and a V section, V transposed or not.

    Independent of the context size and of the cell count; a namespace pins :meth:`describe`.
    """

    v_trans: bool
    k: tuple[Section, ...]
    v: tuple[Section, ...]

    @property
    def n_layer(self) -> int:
        return len(self.k)

    @property
    def sections(self) -> tuple[Section, ...]:
        return self.k + self.v

    @property
    def token_bytes(self) -> int:
        """Bytes of KV per token (cell) across every layer."""
        return sum(s.cell_bytes for s in self.sections)

    def block_bytes(self, block_size: int) -> int:
        return self.token_bytes * block_size

    def describe(self) -> str:
        """A stable one-line description (layer count, V layout, each section's type and size)."""
        k = ",".join(s.describe() for s in self.k)
        v = ",".join(s.describe() for s in self.v)
        return f"{FORMAT}/L{self.n_layer}/vtrans{int(self.v_trans)}/k[{k}]/v[{v}]"


@dataclass(frozen=True)
class Envelope:
    """What surrounds the KV data: a sequence's id (``arch`` empty) or a context's architecture name."""

    seq_id: int = 0
    arch: str = ""
    n_stream: int = 1

    def header(self) -> bytes:
        if self.arch:
            name = self.arch.encode()
            return struct.pack("<I", len(name)) + name + struct.pack("<I", self.n_stream)
        return struct.pack("<IiI", SEQ_MAGIC, self.seq_id, self.n_stream)


@dataclass
class KVState:
    """A parsed state: its envelope, layout and, per section, its cells' bytes (views of the input).

    ``data[i]`` is ``(cells, cell_bytes)`` for a row section and ``(n_embd, cells, elem_bytes)`` for a
    transposed V section, ``i`` indexing :attr:`StateLayout.sections`. An empty state has no layout.
    """

    envelope: Envelope
    layout: StateLayout | None
    cells: int
    data: list[npt.NDArray[np.uint8]]


class _Reader:
    """Little-endian reads over a buffer, every overrun a refusal."""

    def __init__(self, data: StateBytes) -> None:
        self.view = (data.data if isinstance(data, np.ndarray) else memoryview(data)).cast("B")
        self.at = 0

    def take(self, n: int, what: str) -> memoryview:
        end = self.at + n
        if n < 0 or end > len(self.view):
            raise UnsupportedStateError(
                f"state ends inside {what} (offset {self.at}, {len(self.view)} bytes)"
            )
        out = self.view[self.at : end]
        self.at = end
        return out

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        s = struct.Struct("<" + fmt)
        return s.unpack(self.take(s.size, what))

    def array(self, n: int, what: str) -> npt.NDArray[np.uint8]:
        return np.frombuffer(self.take(n, what), np.uint8)


def parse(data: StateBytes, *, seq_id: int | None = None) -> KVState:
    """Parse a sequence or context state of a single sequence (``seq_id``, or whichever it names).

    Raises :class:`~tierkv.errors.UnsupportedStateError` for anything this codec does not know.
    """
    r = _Reader(data)
    envelope = _envelope(r, seq_id)
    want = envelope.seq_id
    cells, layout = 0, None
    sections: list[npt.NDArray[np.uint8]] = []
    for stream in range(envelope.n_stream):
        (count,) = r.unpack("I", f"stream {stream} cell count")
        if count == 0:
            continue
        if layout is not None:
            raise UnsupportedStateError("state holds cells in more than one stream (several sequences)")
        _check_cells(r, count, want)
        cells = count
        layout, sections = _data(r, count)
    if r.at != len(r.view):
        raise UnsupportedStateError(
            f"{len(r.view) - r.at} bytes after the KV cache state: not a single full-attention cache "
            "(sliding-window, recurrent, hybrid and M-RoPE models write other layouts)"
        )
    return KVState(envelope, layout, cells, sections)


def _envelope(r: _Reader, seq_id: int | None) -> Envelope:
    (first,) = r.unpack("I", "state header")
    if first == SEQ_MAGIC:
        (found,) = r.unpack("i", "sequence id")
        if seq_id is not None and found != seq_id:
            raise UnsupportedStateError(f"state of sequence {found}, expected {seq_id}")
        arch = ""
    elif 0 < first <= 256:
        arch = bytes(r.take(first, "architecture name")).decode("ascii", "replace")
        found = 0 if seq_id is None else seq_id
    else:
        raise UnsupportedStateError(f"unknown state header 0x{first:08x} (not a llama.cpp {FORMAT})")
    (n_stream,) = r.unpack("I", "stream count")
    if not 0 < n_stream <= MAX_STREAMS:
        raise UnsupportedStateError(f"state declares {n_stream} KV streams")
    return Envelope(found, arch, n_stream)


_CELL: Final = np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])


def _check_cells(r: _Reader, count: int, seq_id: int) -> None:
    """The cells must be positions 0..count-1 in order, each of sequence ``seq_id`` alone."""
    raw = r.take(count * _CELL.itemsize, "cell metadata")
    cells = np.frombuffer(raw, _CELL)
    if not (cells["n_seq"] == 1).all():
        raise UnsupportedStateError("a cell belongs to several sequences (or carries extra cell fields)")
    if not (cells["seq"] == seq_id).all():
        raise UnsupportedStateError(f"a cell belongs to a sequence other than {seq_id}")
    if not np.array_equal(cells["pos"], np.arange(count, dtype=np.int32)):
        raise UnsupportedStateError("cell positions are not 0..n-1 in order: cannot cut token blocks")


def _data(r: _Reader, cells: int) -> tuple[StateLayout, list[npt.NDArray[np.uint8]]]:
    v_trans, n_layer = r.unpack("II", "layer header")
    if v_trans not in (0, 1) or n_layer == 0:
        raise UnsupportedStateError(f"layer header v_trans={v_trans} n_layer={n_layer}")
    k: list[Section] = []
    data: list[npt.NDArray[np.uint8]] = []
    for layer in range(n_layer):
        section, rows = _rows(r, cells, f"layer {layer} K")
        k.append(section)
        data.append(rows)
    v: list[Section] = []
    for layer in range(n_layer):
        section, rows = _transposed(r, cells, layer) if v_trans else _rows(r, cells, f"layer {layer} V")
        v.append(section)
        data.append(rows)
    return StateLayout(bool(v_trans), tuple(k), tuple(v)), data


def _rows(r: _Reader, cells: int, what: str) -> tuple[Section, npt.NDArray[np.uint8]]:
    type_id, row = r.unpack("iQ", f"{what} header")
    t = kv_type(type_id, what)
    if row == 0 or row % t.block_bytes:
        raise UnsupportedStateError(f"{what}: row of {row} bytes is not whole {t.name} blocks")
    return Section(type_id, row), r.array(cells * row, what).reshape(cells, row)


def _transposed(r: _Reader, cells: int, layer: int) -> tuple[Section, npt.NDArray[np.uint8]]:
    what = f"layer {layer} V (transposed)"
    type_id, elem, n_embd = r.unpack("iII", f"{what} header")
    t = kv_type(type_id, what)
    if t.block_elems != 1 or elem != t.block_bytes or n_embd == 0:
        raise UnsupportedStateError(f"{what}: {t.name} elements of {elem} bytes, n_embd {n_embd}")
    section = Section(type_id, elem * n_embd, elem, n_embd)
    return section, r.array(cells * elem * n_embd, what).reshape(n_embd, cells, elem)


def blocks(
    state: KVState, block_size: int, start: int = 0, stop: int | None = None
) -> Iterator[npt.NDArray[np.uint8]]:
    """Blocks ``start`` .. ``stop`` (default: every full one) of ``state``, each a new flat uint8 array."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    full = state.cells // block_size
    stop = full if stop is None else stop
    if not 0 <= start <= stop <= full:
        raise ValueError(f"blocks {start}..{stop} of a state with {full} full blocks")
    for b in range(start, stop):
        lo, hi = b * block_size, (b + 1) * block_size
        parts = [d[:, lo:hi] if d.ndim == 3 else d[lo:hi] for d in state.data]
        yield np.concatenate([p.reshape(-1) for p in parts])


def rebuild(
    layout: StateLayout,
    run: npt.NDArray[np.uint8] | Sequence[npt.NDArray[np.uint8]],
    block_size: int,
    envelope: Envelope,
) -> bytes:
    """The state llama.cpp would write for the cells of a leading run of blocks (one array per block, or
    their rows), positions ``0..n-1`` of ``envelope``'s sequence; the KV in stream 0 of its streams."""
    size = layout.block_bytes(block_size)
    stack = np.asarray(run, np.uint8).reshape(len(run), -1) if len(run) else np.empty((0, size), np.uint8)
    if stack.shape[1] != size:
        raise ValueError(f"blocks of {stack.shape[1]} bytes, the layout has {size}")
    n_blocks, cells = stack.shape[0], stack.shape[0] * block_size
    meta = np.empty(cells, _CELL)
    meta["pos"] = np.arange(cells)
    meta["n_seq"] = 1
    meta["seq"] = envelope.seq_id
    out = [envelope.header(), struct.pack("<I", cells)]
    if cells:
        out += [meta.tobytes(), struct.pack("<II", int(layout.v_trans), layout.n_layer)]
        at = 0
        for i, s in enumerate(layout.sections):
            span = stack[:, at : at + s.cell_bytes * block_size]
            at += s.cell_bytes * block_size
            out.append(_section_header(s, i < layout.n_layer))
            if s.transposed:
                span = span.reshape(n_blocks, s.n_embd, block_size * s.elem_bytes).transpose(1, 0, 2)
            out.append(np.ascontiguousarray(span).tobytes())
    out.extend(struct.pack("<I", 0) for _ in range(envelope.n_stream - 1))
    return b"".join(out)


def _section_header(s: Section, is_k: bool) -> bytes:
    if s.transposed and not is_k:
        return struct.pack("<iII", s.ggml_type, s.elem_bytes, s.n_embd)
    return struct.pack("<iQ", s.ggml_type, s.cell_bytes)


__all__ = [
    "FORMAT",
    "KV_TYPES",
    "KV_TYPE_IDS",
    "SEQ_MAGIC",
    "Envelope",
    "GgmlType",
    "KVState",
    "Section",
    "StateLayout",
    "blocks",
    "kv_type",
    "parse",
    "rebuild",
]
