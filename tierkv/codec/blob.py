"""Encode arrays into self-describing blobs and decode them back (numpy; sans-IO).

The ``raw`` codec's payload is the values themselves, C order, little-endian, in the blob dtype
(bfloat16 as its 16-bit patterns): lossless and never upcast. The ``int8`` payload is described in
:mod:`tierkv.codec.int8`. Both are framed by the header of :mod:`tierkv.codec.header`.

Decoding trusts nothing: the header checksum, the payload checksum, the blob length and every layout
invariant are verified before a value is produced, and expectations the caller passes (shape, dtype,
codec, tokens, layer group) must match the header exactly.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import xxhash

from tierkv.codec import int8 as int8_codec
from tierkv.codec.bits import convert
from tierkv.codec.expect import NOTHING, Expect
from tierkv.codec.header import (
    CODECS,
    DTYPES,
    FLAG_EXCEPTIONS,
    BlobHeader,
    Buffer,
    DTypeInfo,
    LayerGroup,
    as_byte_view,
    check_u32,
    checksum_parts,
    dtype_info,
    read_header,
)
from tierkv.errors import CodecError, CorruptBlobError

logger = logging.getLogger(__name__)

DTypeArg: TypeAlias = str | np.dtype[Any] | type[np.generic]
"""A value dtype: a name (``"bfloat16"``, ``"float16"`` ...) or a numpy float32/float16 dtype."""


def resolve_dtype(dtype: DTypeArg) -> DTypeInfo:
    """Map a dtype argument to the blob dtype it names; ``uint16`` is refused (bfloat16 must be said)."""
    if isinstance(dtype, str):
        return dtype_info(dtype)
    np_dtype = np.dtype(dtype)
    if np_dtype == np.uint8:
        return DTYPES["uint8"]
    if np_dtype.kind != "f":
        raise CodecError(f"dtype {np_dtype} is not a float dtype; pass dtype='bfloat16' for bfloat16 bits")
    return dtype_info(np_dtype.name)


def source_info(array: npt.NDArray[Any], dtype: DTypeArg | None) -> DTypeInfo:
    """The blob dtype of ``array``: its own float dtype, or bfloat16 where ``dtype`` says so for uint16."""
    if dtype is None:
        if array.dtype == np.uint8:
            return DTYPES["uint8"]
        if array.dtype.kind != "f":
            raise CodecError(
                f"cannot encode {array.dtype} arrays; pass dtype='bfloat16' for uint16 bfloat16 bits"
            )
        return dtype_info(array.dtype.name)
    info = resolve_dtype(dtype)
    if info.name == "bfloat16":
        if array.dtype.kind not in ("u", "i") or array.dtype.itemsize != 2:
            raise CodecError(f"bfloat16 values must be passed as uint16 bits, not {array.dtype}")
    elif array.dtype.newbyteorder("<") != info.storage:
        raise CodecError(f"array dtype {array.dtype} does not match dtype={info.name!r}")
    return info


def default_group_size(shape: Sequence[int]) -> int:
    """The last dimension (head_dim in KV layouts), or 1 where there is none."""
    if shape and shape[-1] > 0:
        return int(shape[-1])
    return 1


def finish_blob(
    *,
    codec: str,
    dtype: str,
    shape: Sequence[int],
    group_size: int,
    tokens: int,
    layer_group: LayerGroup,
    flags: int,
    parts: Sequence[Buffer],
) -> bytes:
    """Checksum the payload parts, put the header in front and join everything with a single copy."""
    digest = xxhash.xxh3_64()
    payload_len = 0
    for part in parts:
        digest.update(part)
        payload_len += memoryview(part).nbytes
    header = BlobHeader(
        codec=codec,
        dtype=dtype,
        shape=tuple(int(d) for d in shape),
        group_size=group_size,
        value_count=math.prod(shape),
        tokens=tokens,
        layer_group=layer_group,
        flags=flags,
        payload_len=payload_len,
        payload_checksum=digest.intdigest(),
    )
    return b"".join([header.pack(), *parts])


def check_encode_args(
    codec: str, shape: Sequence[int], group_size: int | None, tokens: int, layer_group: LayerGroup | int
) -> tuple[int, LayerGroup]:
    """Validate the arguments shared by the numpy and torch encoders; return (group size, layer group)."""
    if codec not in CODECS:
        raise CodecError(f"unknown codec {codec!r}; expected one of {sorted(CODECS)}")
    check_u32("tokens", tokens)
    try:
        group = LayerGroup(layer_group)
    except ValueError as exc:
        raise CodecError(f"unknown layer group {layer_group!r}") from exc
    if codec == "raw":
        return 0, group
    size = default_group_size(shape) if group_size is None else group_size
    if size < 1:
        raise CodecError(f"group_size must be >= 1, got {size}")
    return check_u32("group_size", size), group


def encode(
    array: npt.NDArray[Any],
    codec: str = "raw",
    group_size: int | None = None,
    tokens: int = 0,
    layer_group: LayerGroup = LayerGroup.ATTENTION,
    dtype: DTypeArg | None = None,
) -> bytes:
    """Encode ``array`` into one blob.

    ``dtype="bfloat16"`` declares a ``uint16`` array to hold bfloat16 bits (numpy has no bfloat16).
    ``group_size`` (int8 only) defaults to the last dimension; groups run along the flattened array.
    """
    if isinstance(array, np.generic):
        array = np.asarray(array)
    if not isinstance(array, np.ndarray):
        raise CodecError(f"encode takes a numpy array, got {type(array).__name__} (torch: use encode_tensor)")
    info = source_info(array, dtype)
    if codec == "int8" and not info.is_float:
        raise CodecError(f"the int8 codec quantizes floats; {info.name} values are stored raw")
    size, group = check_encode_args(codec, array.shape, group_size, tokens, layer_group)
    values = np.ascontiguousarray(array).reshape(-1)
    little = values.dtype.newbyteorder("<")
    if values.dtype != little:
        values = values.astype(little)
    values = values.view(info.storage)
    flags = 0
    parts: list[Buffer]
    if codec == "raw":
        parts = [values.data.cast("B")]
    else:
        layout = int8_codec.Int8Layout(values.size, size)
        region = np.empty(layout.groups_len, np.uint8)
        exceptions = int8_codec.quantize(values, info, layout, region)
        parts = [region.data]
        if exceptions.size:
            flags |= FLAG_EXCEPTIONS
            raw = int8_codec.gather_groups(values, layout, exceptions)
            parts.append(int8_codec.pack_exceptions(exceptions, raw, info))
            logger.debug(
                "int8: %d of %d groups hold inf/NaN and are stored raw", exceptions.size, layout.groups
            )
    return finish_blob(
        codec=codec,
        dtype=info.name,
        shape=array.shape,
        group_size=size,
        tokens=tokens,
        layer_group=group,
        flags=flags,
        parts=parts,
    )


def open_blob(blob: Buffer) -> tuple[BlobHeader, npt.NDArray[np.uint8]]:
    """Verify header and payload checksums; return the header and a zero-copy view of the payload."""
    view = as_byte_view(blob)
    header = read_header(view)
    payload = np.frombuffer(view, np.uint8, count=header.payload_len, offset=header.header_len)
    if xxhash.xxh3_64_intdigest(payload.data) != header.payload_checksum:
        raise CorruptBlobError("payload checksum mismatch")
    return header, payload


def verify_parts(head: Buffer, payload: Sequence[Buffer], *, expect: Expect) -> BlobHeader:
    """Verify a ``raw`` blob that arrived in pieces: its header in ``head``, its payload spread over
    ``payload`` (the rows of a cache it was received into). Checks what :func:`open_blob` and
    :meth:`Expect.check` check, shape and dtype always: the bytes are already where values of that
    shape and dtype live, so nothing else may pass."""
    if expect.shape is None or expect.dtype is None:
        raise ValueError("verify_parts needs the expected shape and dtype")
    header = read_header(head, partial=True)
    if len(as_byte_view(head)) != header.header_len:
        raise CorruptBlobError(f"{len(head)} bytes of head for a header of {header.header_len}")
    expect.but(codec="raw").check(header)
    if sum(len(memoryview(p).cast("B")) for p in payload) != header.payload_len:
        raise CorruptBlobError(f"payload parts do not add up to the header's {header.payload_len} bytes")
    if checksum_parts(payload) != header.payload_checksum:
        raise CorruptBlobError("payload checksum mismatch")
    return header


def verify(blob: Buffer) -> BlobHeader:
    """Check everything :func:`decode` checks, without decoding (e.g. before a vault stores a blob)."""
    header, payload = open_blob(blob)
    if header.codec == "int8":
        int8_codec.parse_exceptions(
            payload, int8_codec.Int8Layout(header.value_count, header.group_size), header.dtype_info
        )
    return header


def output_storage(header: BlobHeader, out_dtype: DTypeArg | None) -> DTypeInfo:
    """The dtype decode produces: ``out_dtype``, else the blob dtype for raw and float32 for int8."""
    if out_dtype is not None:
        target = resolve_dtype(out_dtype)
        if target is not header.dtype_info and not (target.is_float and header.dtype_info.is_float):
            raise CodecError(f"{header.dtype} values cannot be decoded as {target.name}")
        return target
    return header.dtype_info if header.codec == "raw" else dtype_info("float32")


def decode(
    blob: Buffer,
    *,
    out_dtype: DTypeArg | None = None,
    out: npt.NDArray[Any] | None = None,
    copy: bool = True,
    expect: Expect = NOTHING,
) -> tuple[BlobHeader, npt.NDArray[Any]]:
    """Verify and decode one blob into an array of the header's shape.

    raw decodes to the blob dtype (bfloat16 as ``uint16`` bits), int8 to float32, unless ``out_dtype``
    asks for another (``"bfloat16"`` gives ``uint16`` bits). ``out`` is a C-contiguous, writable array
    of that shape and storage dtype to decode into. ``copy=False`` lets a raw blob in the blob dtype be
    returned as a read-only view of ``blob`` (valid only as long as that buffer is). ``expect`` is what
    the header must say (:class:`~tierkv.codec.expect.Expect`).
    """
    header, payload = open_blob(blob)
    expect.check(header)
    target = output_storage(header, out_dtype)
    if out is not None:
        check_out(out, header, target)
    return header, decode_payload(header, payload, target, out=out, copy=copy)


def decode_payload(
    header: BlobHeader,
    payload: npt.NDArray[np.uint8],
    target: DTypeInfo,
    *,
    out: npt.NDArray[Any] | None = None,
    copy: bool = True,
) -> npt.NDArray[Any]:
    """Decode a verified payload (from :func:`open_blob`) into ``out`` or a new ``target`` array."""
    src = header.dtype_info
    if header.codec == "raw":
        values = payload.view(src.storage)
        if out is not None:
            convert(values, src.name, target.name, out=out.reshape(-1))
            return out
        if target is not src:
            return convert(values, src.name, target.name).reshape(header.shape)
        return (values.copy() if copy else values).reshape(header.shape)
    layout = int8_codec.Int8Layout(header.value_count, header.group_size)
    indices, raw = int8_codec.parse_exceptions(payload, layout, src)
    result = out if out is not None else np.empty(header.shape, target.storage)
    flat = result.reshape(-1)
    int8_codec.dequantize(payload[: layout.groups_len], layout, flat, target.name)
    if indices.size:
        int8_codec.restore_exceptions(flat, layout, indices, raw, src=src.name, dst=target.name)
    return result


def check_out(out: npt.NDArray[Any], header: BlobHeader, target: DTypeInfo) -> None:
    """``out`` must be a writable C-contiguous array of the blob's shape in the target storage dtype."""
    if out.shape != header.shape or out.dtype != target.storage:
        raise CodecError(
            f"out is {out.dtype}{list(out.shape)}, blob decodes to {target.storage}{list(header.shape)}"
        )
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise CodecError("out must be C-contiguous and writable")
