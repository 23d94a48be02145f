"""The self-describing blob header, its checksums and the registries of codecs, dtypes and layer groups.

A vault stores opaque bytes and an engine restores them much later, possibly with another tierkv version:
everything needed to decode a blob (and to refuse it) therefore travels in the blob itself. The header is
little-endian, ``struct``-packed, 8-byte aligned, and covered by its own checksum, so a reader can trust
each field before it looks at the payload. Layout (offsets in bytes)::

    0   4s   magic             b"TKVB"
    4   u16  version           FORMAT_VERSION (1)
    6   u16  header_len        56 + 8 * ndim; the payload starts here
    8   u8   codec             1 raw, 2 int8
    9   u8   dtype             1 float32, 2 float16, 3 bfloat16 (dtype of the encoded values)
    10  u8   ndim              0 .. MAX_NDIM
    11  u8   layer_group       1 attention, 2 sliding, 3 ssm, 4 conv
    12  u16  flags             bit 0: int8 exception table present (non-finite groups stored raw)
    14  u16  reserved          0
    16  u32  group_size        int8 values per group; 0 for raw
    20  u32  tokens            tokens covered by the block (informational, checked on request)
    24  u64  value_count       product of the shape
    32  u64  payload_len       bytes after the header
    40  u64  payload_checksum  xxh3_64 (seed 0) of the payload
    48  u64  shape[ndim]       dims, outermost first
    ..  u64  header_checksum   xxh3_64 (seed 0) of the header bytes before it

A blob is exactly ``header_len + payload_len`` bytes. Every violation found in the bytes raises
:class:`~tierkv.errors.CorruptBlobError`; a well-formed header from an unknown format version, codec or
dtype (a newer writer) raises its parent :class:`~tierkv.errors.CodecError`.
"""

from __future__ import annotations

import enum
import logging
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, TypeAlias

import numpy as np
import xxhash

from tierkv.errors import CodecError, CorruptBlobError

logger = logging.getLogger(__name__)

Buffer: TypeAlias = bytes | bytearray | memoryview
"""What decoders accept: any C-contiguous bytes-like object, read without copying."""

MAGIC: Final = b"TKVB"
FORMAT_VERSION: Final = 1
MAX_NDIM: Final = 32
FLAG_EXCEPTIONS: Final = 0x0001
KNOWN_FLAGS: Final = FLAG_EXCEPTIONS
SCALE_BYTES: Final = 4
"""Bytes of the float32 scale that precedes each int8 group."""

_FIXED: Final = struct.Struct("<4sHHBBBBHHIIQQQ")
_U64: Final = struct.Struct("<Q")
MIN_HEADER_LEN: Final = _FIXED.size + _U64.size
MAX_HEADER_LEN: Final = MIN_HEADER_LEN + _U64.size * MAX_NDIM
_U32_MAX: Final = 0xFFFF_FFFF


class LayerGroup(enum.IntEnum):
    """Kind of state a blob holds; the cluster routes by it (see :attr:`role`)."""

    ATTENTION = 1
    SLIDING = 2
    SSM = 3
    CONV = 4

    @property
    def role(self) -> str:
        """The vault role that stores this group: ``kv_cold`` for KV, ``ssm_cold`` for recurrent state."""
        return "kv_cold" if self in (LayerGroup.ATTENTION, LayerGroup.SLIDING) else "ssm_cold"


class Codec(enum.IntEnum):
    """Wire ids of the payload codecs."""

    RAW = 1
    INT8 = 2


CODECS: Final[Mapping[str, Codec]] = MappingProxyType({c.name.lower(): c for c in Codec})
"""Codec name (as passed to ``encode``) -> wire id."""
_CODEC_NAMES: Final = {c: name for name, c in CODECS.items()}
_CODEC_BY_ID: Final = {int(c): c for c in Codec}
_GROUP_BY_ID: Final = {int(g): g for g in LayerGroup}
_SHAPES: Final = tuple(struct.Struct(f"<{n}Q") for n in range(MAX_NDIM + 1))
"""The shape field of a header of each dimension count, compiled once (a header is read per blob)."""


@dataclass(frozen=True)
class DTypeInfo:
    """How one value dtype is stored and inspected bit-wise.

    ``storage`` is the numpy dtype of stored values (bfloat16 has none in numpy, so its raw bits are
    ``uint16``); ``bits`` is the unsigned integer of the same width and ``abs_mask`` clears the sign bit,
    so the int8 codec finds group maxima with one integer max. A group whose largest magnitude bits
    reach ``raw_bits`` is stored raw: inf and NaN, and for float32/bfloat16 also magnitudes of 2**127 and
    more, where ``q * scale`` could round past the largest finite float. ``uint8`` is opaque bytes
    (packed formats such as quantized KV caches): raw only, never converted to another dtype.
    """

    name: str
    wire_id: int
    storage: np.dtype[Any]
    bits: np.dtype[Any]
    abs_mask: int
    raw_bits: int
    is_float: bool = True

    @property
    def itemsize(self) -> int:
        return int(self.storage.itemsize)


DTYPES: Final[Mapping[str, DTypeInfo]] = MappingProxyType(
    {
        "float32": DTypeInfo("float32", 1, np.dtype("<f4"), np.dtype("<u4"), 0x7FFF_FFFF, 0x7F00_0000),
        "float16": DTypeInfo("float16", 2, np.dtype("<f2"), np.dtype("<u2"), 0x7FFF, 0x7C00),
        "bfloat16": DTypeInfo("bfloat16", 3, np.dtype("<u2"), np.dtype("<u2"), 0x7FFF, 0x7F00),
        "uint8": DTypeInfo("uint8", 4, np.dtype("u1"), np.dtype("u1"), 0xFF, 0x100, is_float=False),
    }
)
"""Value dtypes a blob can carry, by canonical name."""

_DTYPE_BY_ID: Final = {d.wire_id: d for d in DTYPES.values()}
_DTYPE_ALIASES: Final = {
    "fp32": "float32",
    "float": "float32",
    "f4": "float32",
    "<f4": "float32",
    "fp16": "float16",
    "half": "float16",
    "f2": "float16",
    "<f2": "float16",
    "bf16": "bfloat16",
}


def dtype_info(name: str) -> DTypeInfo:
    """Look a value dtype up by name or common alias (``"bf16"``, ``"fp16"`` ...)."""
    key = name.lower()
    info = DTYPES.get(_DTYPE_ALIASES.get(key, key))
    if info is None:
        raise CodecError(f"unsupported dtype {name!r}; expected one of {sorted(DTYPES)}")
    return info


def group_count(value_count: int, group_size: int) -> int:
    """Number of int8 groups, the last one possibly short."""
    return -(-value_count // group_size) if group_size > 0 else 0


def int8_groups_len(value_count: int, group_size: int) -> int:
    """Bytes of the int8 group region: one float32 scale per group plus one byte per value."""
    return SCALE_BYTES * group_count(value_count, group_size) + value_count


def as_byte_view(blob: Buffer) -> memoryview:
    """A flat, read-only ``uint8`` memoryview of ``blob`` without copying it."""
    try:
        view = memoryview(blob)
    except TypeError as exc:
        raise CodecError(f"a blob must be bytes-like, got {type(blob).__name__}") from exc
    if not view.c_contiguous:
        raise CodecError("a blob must be a C-contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view.toreadonly()


def header_len(ndim: int) -> int:
    """Bytes of the header of a blob of ``ndim`` dimensions (where its payload starts)."""
    return MIN_HEADER_LEN + _U64.size * ndim


def checksum(data: Buffer) -> int:
    """xxh3_64 (seed 0) of ``data``; the checksum used for headers and payloads."""
    return int(xxhash.xxh3_64_intdigest(data))


def checksum_parts(parts: Sequence[Buffer]) -> int:
    """:func:`checksum` of the concatenation of ``parts``, without joining them (a payload received
    straight into the rows of a cache)."""
    state = xxhash.xxh3_64()
    for part in parts:
        state.update(part)
    return int(state.intdigest())


@dataclass(frozen=True)
class BlobHeader:
    """The decoded, verified header of one blob; ``codec`` and ``dtype`` are names ("int8", "bfloat16")."""

    codec: str
    dtype: str
    shape: tuple[int, ...]
    group_size: int
    value_count: int
    tokens: int
    layer_group: LayerGroup
    flags: int
    payload_len: int
    payload_checksum: int
    version: int = FORMAT_VERSION

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def header_len(self) -> int:
        return header_len(len(self.shape))

    @property
    def blob_len(self) -> int:
        """Total bytes of the blob: header plus payload."""
        return self.header_len + self.payload_len

    @property
    def has_exceptions(self) -> bool:
        """True when an int8 payload carries non-finite groups stored raw."""
        return bool(self.flags & FLAG_EXCEPTIONS)

    @property
    def dtype_info(self) -> DTypeInfo:
        return DTYPES[self.dtype]

    @property
    def decoded_nbytes(self) -> int:
        """Bytes of the values in their original dtype (the "input size" of throughput figures)."""
        return self.value_count * self.dtype_info.itemsize

    def pack(self) -> bytes:
        """Serialize, appending the header checksum."""
        if len(self.shape) > MAX_NDIM:
            raise CodecError(f"at most {MAX_NDIM} dimensions are supported, got {len(self.shape)}")
        body = _FIXED.pack(
            MAGIC,
            self.version,
            self.header_len,
            CODECS[self.codec],
            DTYPES[self.dtype].wire_id,
            len(self.shape),
            int(self.layer_group),
            self.flags,
            0,
            self.group_size,
            self.tokens,
            self.value_count,
            self.payload_len,
            self.payload_checksum,
        ) + struct.pack(f"<{len(self.shape)}Q", *self.shape)
        return body + _U64.pack(checksum(body))


def read_header(blob: Buffer, *, partial: bool = False) -> BlobHeader:
    """Parse and verify the header of ``blob`` (its checksum and internal consistency, not the payload).

    Cheap: it hashes at most a few hundred bytes. The blob's length must be exactly header plus payload
    unless ``partial`` is true, which accepts any prefix holding the whole header (e.g. a ranged read).
    """
    view = as_byte_view(blob)
    fields = _verified_fields(view)
    (_, version, header_len, codec_id, dtype_id, ndim, layer_group, flags, reserved) = fields[:9]
    group_size, tokens, value_count, payload_len, payload_checksum = fields[9:]
    codec, dtype, group = _known_ids(codec_id, dtype_id, layer_group, flags, reserved)
    shape = _SHAPES[ndim].unpack_from(view, _FIXED.size)
    if math.prod(shape) != value_count:
        raise CorruptBlobError(f"value count {value_count} does not match shape {shape}")
    _check_payload_len(codec, dtype, group_size, flags, value_count, payload_len)
    if not partial and len(view) != header_len + payload_len:
        raise CorruptBlobError(
            f"blob length {len(view)} != header {header_len} + payload {payload_len} (truncated or padded)"
        )
    return BlobHeader(
        codec=_CODEC_NAMES[codec],
        dtype=dtype.name,
        shape=shape,
        group_size=group_size,
        value_count=value_count,
        tokens=tokens,
        layer_group=group,
        flags=flags,
        payload_len=payload_len,
        payload_checksum=payload_checksum,
        version=version,
    )


def _verified_fields(view: memoryview) -> tuple[Any, ...]:
    """The fixed header fields, once magic, length, header checksum and format version check out."""
    if len(view) < MIN_HEADER_LEN:
        raise CorruptBlobError(f"truncated blob: {len(view)} bytes, a header needs at least {MIN_HEADER_LEN}")
    fields = _FIXED.unpack_from(view)
    magic, version, header_len, ndim = fields[0], fields[1], fields[2], fields[5]
    if magic != MAGIC:
        raise CorruptBlobError(f"not a tierkv blob: magic {bytes(magic)!r}")
    if ndim > MAX_NDIM or header_len != MIN_HEADER_LEN + _U64.size * ndim:
        raise CorruptBlobError(f"inconsistent header: ndim {ndim}, header_len {header_len}")
    if len(view) < header_len:
        raise CorruptBlobError(f"truncated blob: {len(view)} bytes, the header alone needs {header_len}")
    (stored,) = _U64.unpack_from(view, header_len - _U64.size)
    if stored != checksum(view[: header_len - _U64.size]):
        raise CorruptBlobError("header checksum mismatch")
    if version != FORMAT_VERSION:
        raise CodecError(f"unsupported blob format version {version} (this reader knows {FORMAT_VERSION})")
    return tuple(fields)


def _known_ids(
    codec_id: int, dtype_id: int, layer_group: int, flags: int, reserved: int
) -> tuple[Codec, DTypeInfo, LayerGroup]:
    """Codec, dtype and layer group of a header; a :class:`CodecError` for ids a newer writer made."""
    try:
        ids = _CODEC_BY_ID[codec_id], _DTYPE_BY_ID[dtype_id], _GROUP_BY_ID[layer_group]
    except KeyError as exc:
        raise CodecError(
            f"unknown codec/dtype/layer group ids {codec_id}/{dtype_id}/{layer_group}; newer writer?"
        ) from exc
    if flags & ~KNOWN_FLAGS or reserved:
        raise CodecError(f"unknown header flags {flags:#06x} / reserved {reserved:#06x}; newer writer?")
    if ids[0] is Codec.INT8 and not ids[1].is_float:
        raise CorruptBlobError(f"an int8 payload cannot hold {ids[1].name} values")
    return ids


def _check_payload_len(
    codec: Codec, dtype: DTypeInfo, group_size: int, flags: int, value_count: int, payload_len: int
) -> None:
    """The payload length a header declares must be the one its codec produces for its values."""
    if codec is Codec.RAW:
        if group_size or flags or payload_len != value_count * dtype.itemsize:
            raise CorruptBlobError(
                f"inconsistent raw header: group {group_size}, flags {flags}, payload {payload_len}"
            )
        return
    base = int8_groups_len(value_count, group_size)
    has_table = payload_len > base
    if group_size < 1 or payload_len < base or has_table != bool(flags & FLAG_EXCEPTIONS):
        raise CorruptBlobError(
            f"inconsistent int8 header: group {group_size}, values {value_count}, "
            f"payload {payload_len}, flags {flags}"
        )


def check_u32(name: str, value: int) -> int:
    """Validate a header field that is stored as u32."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value <= _U32_MAX:
        raise CodecError(f"{name} must be in [0, 2**32), got {value}")
    return int(value)
