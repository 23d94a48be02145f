"""Torch twin of the numpy codec: quantize and dequantize on the tensor's own device.

On a GPU only the int8 values and their scales cross PCIe (about half the bytes of bf16/fp16). The
arithmetic is the numpy codec's, operation for operation (integer max of the masked bits, true
float32 division by tensors -- never by a Python scalar, which CUDA turns into a reciprocal multiply --,
round half to even, clamp), so a tensor and its numpy twin encode to identical blobs. Framing, checksums
and the exception table are shared with :mod:`tierkv.codec.blob`; this module only adds the tensor math.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import torch

from tierkv.codec import blob as np_blob
from tierkv.codec import int8 as int8_codec
from tierkv.codec.bits import convert
from tierkv.codec.expect import NOTHING, Expect
from tierkv.codec.header import (
    FLAG_EXCEPTIONS,
    SCALE_BYTES,
    BlobHeader,
    Buffer,
    DTypeInfo,
    LayerGroup,
    dtype_info,
)
from tierkv.errors import CodecError

logger = logging.getLogger(__name__)

TORCH_DTYPES: Final = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
"""Blob dtype name -> torch dtype."""
_NAMES: Final = {v: k for k, v in TORCH_DTYPES.items()}
_BITS: Final = {"float32": torch.int32, "float16": torch.int16, "bfloat16": torch.int16}
CPU_CHUNK_VALUES: Final = 1 << 19
"""Values quantized per step on CPU: torch's ops are multi-threaded, so a larger chunk than numpy's."""
CPU_DECODE_VALUES: Final = 1 << 19
"""Values dequantized per step on CPU. A step is about eight torch calls (tens of µs of Python and
OpenMP fork / join) around three passes, so short steps pay that cost too often; the float32 scratch
(2 MiB here) need not fit L2, the working set of a step (3.5 MiB) stays in a server CPU's L3. On the
2-core test machine (512 KiB L2 per core, 32 MiB L3), against steps of 2**17 values (512 KiB of scratch,
the L2's size), interleaved: 1.07-1.30x (1 thread) and 1.18-1.42x (2 threads) for bf16 and 1.04-1.20x
for float32; steps of 2**20 were a little faster still and 2**22 (16 MiB of scratch) slower than
2**17. Fusing the passes (a mixed-dtype multiply, or one into a bf16 ``out``) ran at 0.6x of the three."""
_SCRATCH = threading.local()

TorchDTypeArg = torch.dtype | str | None


def dtype_name(dtype: torch.dtype | str) -> str:
    """The blob dtype name of a torch dtype (or of a name/alias)."""
    if isinstance(dtype, torch.dtype):
        name = _NAMES.get(dtype)
        if name is None:
            raise CodecError(f"unsupported tensor dtype {dtype}; expected one of {sorted(TORCH_DTYPES)}")
        return name
    return dtype_info(dtype).name


def numpy_view(t: torch.Tensor) -> npt.NDArray[Any]:
    """Zero-copy numpy view of a contiguous CPU tensor in blob storage (bfloat16 as uint16 bits)."""
    if t.dtype == torch.bfloat16:
        return np.asarray(t.view(torch.int16).numpy()).view(np.uint16)
    return np.asarray(t.numpy())


def _quantize_rows(
    src: torch.Tensor, info: DTypeInfo, *, accelerator: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scales f32 (n,), q int8 (n, width), keep-raw mask (n,)) of ``src`` (n, width), on its device.

    ``accelerator`` selects the sync-free variant (no data-dependent branch) that also never divides by
    a Python scalar; it is what runs on GPUs and gives the same bits on CPU.
    """
    magnitude = src.view(_BITS[info.name]) & info.abs_mask
    amax = magnitude.amax(dim=1)
    keep_raw = amax >= info.raw_bits
    amax = amax.masked_fill(keep_raw, 0)
    amax_f32 = amax.view(TORCH_DTYPES[info.name]).float()
    if not accelerator:
        scale = amax_f32 / float(int8_codec.QMAX)  # a true float32 division on CPU
    else:
        scale = torch.div(amax_f32, torch.full_like(amax_f32, float(int8_codec.QMAX)))
    divisor = scale.masked_fill(scale == 0, 1.0)
    # float32 input must not be divided in place (it is the caller's tensor); the others widen to a copy
    x = src / divisor[:, None] if src.dtype == torch.float32 else src.float().div_(divisor[:, None])
    x.round_().clamp_(-int8_codec.QMAX, int8_codec.QMAX)
    q = x.to(torch.int8)
    # Rows kept raw hold garbage here; zero them (on CPU only when needed, elsewhere without a sync).
    if accelerator or bool(keep_raw.any()):
        q.masked_fill_(keep_raw[:, None], 0)
    return scale, q, keep_raw


def _quantize(
    flat: torch.Tensor,
    info: DTypeInfo,
    layout: int8_codec.Int8Layout,
    region: npt.NDArray[np.uint8],
    *,
    accelerator: bool,
) -> int8_codec.IntArray:
    """Fill the host ``region`` from ``flat`` (quantized on its device); return the groups to keep raw.

    On an ``accelerator`` the records are built in device memory in one pass and copied to the host
    once; on CPU they are written straight into ``region``, a cache-sized chunk at a time.
    """
    on_cpu = not accelerator
    host = torch.from_numpy(region)
    work = host if on_cpu else torch.empty(layout.groups_len, dtype=torch.uint8, device=flat.device)
    keep_raw = torch.zeros(layout.groups, dtype=torch.bool, device=flat.device)
    g = layout.group_size
    step = max(1, CPU_CHUNK_VALUES // g) if on_cpu else max(1, layout.full_groups)
    offset = 0
    for first, n, width in layout.pieces():
        records = work[offset : offset + n * (SCALE_BYTES + width)].view(n, SCALE_BYTES + width)
        src = flat[first * g : first * g + n * width].view(n, width)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            scale, q, bad = _quantize_rows(src[r0:r1], info, accelerator=accelerator)
            records[r0:r1, :SCALE_BYTES].copy_(scale.view(torch.uint8).view(r1 - r0, SCALE_BYTES))
            records[r0:r1, SCALE_BYTES:].copy_(q.view(torch.uint8))
            keep_raw[first + r0 : first + r1] = bad
        offset += n * (SCALE_BYTES + width)
    if not on_cpu:
        host.copy_(work)
    return np.asarray(keep_raw.nonzero().flatten().cpu().numpy(), dtype=np.int64)


def encode_tensor(
    t: torch.Tensor,
    codec: str = "raw",
    group_size: int | None = None,
    tokens: int = 0,
    layer_group: LayerGroup = LayerGroup.ATTENTION,
) -> bytes:
    """Encode a tensor into the blob ``encode`` makes of its numpy twin; int8 is computed on ``t.device``."""
    if not isinstance(t, torch.Tensor):
        raise CodecError(f"encode_tensor takes a torch.Tensor, got {type(t).__name__}")
    info = dtype_info(dtype_name(t.dtype))
    shape = tuple(t.shape)
    size, group = np_blob.check_encode_args(codec, shape, group_size, tokens, layer_group)
    flat = t.detach().contiguous().view(-1)
    if codec == "raw":
        values = numpy_view(_on_host(flat))
        parts: list[Buffer] = [values.data.cast("B")]
        flags = 0
    else:
        layout = int8_codec.Int8Layout(flat.numel(), size)
        region = np.empty(layout.groups_len, np.uint8)
        exceptions = _quantize(flat, info, layout, region, accelerator=flat.device.type != "cpu")
        parts = [region.data]
        flags = 0
        if exceptions.size:
            flags = FLAG_EXCEPTIONS
            raw = torch.cat(
                [flat[int(i) * size : int(i) * size + layout.group_len(int(i))] for i in exceptions]
            )
            parts.append(int8_codec.pack_exceptions(exceptions, numpy_view(raw.cpu()), info))
    return np_blob.finish_blob(
        codec=codec,
        dtype=info.name,
        shape=shape,
        group_size=size,
        tokens=tokens,
        layer_group=group,
        flags=flags,
        parts=parts,
    )


def _dequantize(
    header: BlobHeader,
    payload: npt.NDArray[np.uint8],
    target: str,
    device: torch.device,
    *,
    accelerator: bool,
    into: torch.Tensor | None = None,
) -> torch.Tensor:
    """int8 payload -> tensor on ``device``: only int8 + scales are copied there, the multiply runs there.

    On an ``accelerator`` every group is done in one pass; on CPU a cache-sized chunk at a time. The
    products are rounded straight into the result (``into``, a contiguous tensor of the target dtype on
    ``device``, when given): no float32 temporary, no second copy.
    """
    layout = int8_codec.Int8Layout(header.value_count, header.group_size)
    indices, raw = int8_codec.parse_exceptions(payload, layout, header.dtype_info)
    out = (
        into.view(-1)
        if into is not None
        else torch.empty(header.value_count, dtype=TORCH_DTYPES[target], device=device)
    )
    g = layout.group_size
    for first, q, scales in _records(layout, payload[: layout.groups_len], device, accelerator):
        scale_groups(q, scales, out.narrow(0, first, q.numel()).view(q.shape), accelerator=accelerator)
    pos = 0
    for index in indices:
        start = int(index) * g
        n = layout.group_len(int(index))
        host = torch.empty(n, dtype=TORCH_DTYPES[target])
        convert(raw[pos : pos + n], header.dtype, target, out=numpy_view(host))
        out[start : start + n].copy_(host)
        pos += n
    return out.view(header.shape)


def scale_groups(q: torch.Tensor, scales: torch.Tensor, dst: torch.Tensor, *, accelerator: bool) -> None:
    """``dst = q * scales`` for groups ``q`` (n, width) int8 and ``scales`` (n, 1) float32: in one pass on
    an ``accelerator``, on CPU in steps whose float32 scratch stays in L2."""
    n, width = q.shape
    step = n if accelerator else max(1, CPU_DECODE_VALUES // width)
    scratch = None if accelerator or dst.dtype == torch.float32 else cpu_scratch(min(step, n) * width)
    # narrow() rather than [a:b]: torch's Python indexing costs microseconds a call, which small blobs feel
    for r0 in range(0, n, step):
        rows = min(step, n - r0)
        if rows == n:
            _scale_rows(q, scales, dst, scratch)
        else:
            _scale_rows(q.narrow(0, r0, rows), scales.narrow(0, r0, rows), dst.narrow(0, r0, rows), scratch)


def _records(
    layout: int8_codec.Int8Layout, region: npt.NDArray[np.uint8], device: torch.device, accelerator: bool
) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(first value, q (n, width) int8, scales (n, 1) float32)`` of each piece of the group region.

    On CPU these are views of the received bytes (numpy slices them for a fraction of torch's cost per
    call); for an ``accelerator`` the region is staged in pinned memory and copied to ``device`` once.
    """
    if not accelerator:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns about read-only buffers; we only read
            return [
                (first, torch.from_numpy(q), torch.from_numpy(_aligned(scales)[:, None]))
                for first, scales, q in layout.parts(region)
            ]
    staging = torch.empty(layout.groups_len, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    numpy_view(staging)[:] = region
    on_device = staging.to(device, non_blocking=True)
    pieces = []
    offset = 0
    for first_group, n, width in layout.pieces():
        records = on_device.narrow(0, offset, n * (SCALE_BYTES + width)).view(n, SCALE_BYTES + width)
        scales = records.narrow(1, 0, SCALE_BYTES).clone(memory_format=torch.contiguous_format)
        q = records.narrow(1, SCALE_BYTES, width).view(torch.int8)
        pieces.append((first_group * layout.group_size, q, scales.view(torch.float32)))
        offset += n * (SCALE_BYTES + width)
    return pieces


def _aligned(scales: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``scales`` in place where its stride is whole float32s (torch needs that), else a compact copy."""
    return scales if scales.strides[0] % scales.itemsize == 0 else scales.copy()


def _scale_rows(
    q: torch.Tensor, scales: torch.Tensor, dst: torch.Tensor, scratch: torch.Tensor | None
) -> None:
    """``dst = q * scales``, the product in float32 and rounded once into ``dst``'s dtype.

    On CPU torch's mixed-dtype multiply casts value by value; widening into a float32 ``scratch``, scaling
    in place and narrowing on the copy are three vectorized passes instead (same bits).
    """
    if scratch is None:
        if dst.device.type == "cpu":
            dst.copy_(q)
            dst.mul_(scales)
        else:
            torch.mul(q, scales, out=dst)
        return
    dst.copy_(widened(q, scales, scratch))


def widened(q: torch.Tensor, scales: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """``q * scales`` in float32, in the front of ``scratch`` (a view of it, rounded only when copied out;
    :mod:`tierkv.codec.torch_rows` copies it into one slot per blob)."""
    wide = scratch.narrow(0, 0, q.numel()).view(q.shape)
    wide.copy_(q)
    wide.mul_(scales)
    return wide


def cpu_scratch(values: int) -> torch.Tensor:
    """This thread's float32 scratch of at least ``values`` values (kept between calls; also the one
    :mod:`tierkv.codec.torch_rows` scales runs of blobs in)."""
    have: torch.Tensor | None = getattr(_SCRATCH, "f32", None)
    if have is None or have.numel() < values:
        have = torch.empty(max(values, CPU_DECODE_VALUES), dtype=torch.float32)
        _SCRATCH.f32 = have
    return have


def _read_only_tensor(array: npt.NDArray[Any]) -> torch.Tensor:
    """A tensor over ``array``'s memory (possibly a read-only received buffer); callers only read it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns about read-only buffers
        return torch.from_numpy(array)


def _payload_view(payload: npt.NDArray[np.uint8], header: BlobHeader) -> torch.Tensor:
    """A tensor over a raw payload's bytes, without a copy; only ever read from."""
    bits = payload.view(np.int16) if header.dtype == "bfloat16" else payload.view(np.dtype(header.dtype))
    tensor = _read_only_tensor(bits)
    if header.dtype == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor.view(header.shape)


def _on_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the host; from an accelerator through pinned memory, which the copy reaches at the DMA's
    rate rather than through the driver's pageable staging (9 GB/s against ~50 on an H200 host)."""
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=torch.cuda.is_available())
    return host.copy_(t)


def _pinned(payload: npt.NDArray[np.uint8], header: BlobHeader) -> torch.Tensor:
    """A copy of a raw payload in pinned host memory, as a tensor of the blob's dtype and shape.

    torch's caching host allocator keeps the block from being handed out again until the copies queued
    from it are done, so the caller may drop it as soon as a non-blocking copy is queued.
    """
    staging = torch.empty(payload.size, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    numpy_view(staging)[:] = payload
    return staging.view(TORCH_DTYPES[header.dtype]).view(header.shape)


def view_tensor(blob: Buffer, *, expect: Expect = NOTHING) -> torch.Tensor:
    """Verify a ``raw`` blob and return its values as a CPU tensor over the blob's own memory.

    No copy is made: a hook writes the tensor straight into its cache, so a restored block is copied
    once after it was received, not decoded into a buffer first. The tensor is valid only as long as
    ``blob`` is and must never be written to. Any other codec is a :class:`CodecError`.
    """
    header, payload = open_checked(blob, expect=expect.but(codec="raw"))
    return _payload_view(payload, header)


def decode_tensor(
    blob: Buffer,
    device: torch.device | str = "cpu",
    dtype: TorchDTypeArg = None,
    *,
    out: torch.Tensor | None = None,
    expect: Expect = NOTHING,
) -> tuple[BlobHeader, torch.Tensor]:
    """Verify and decode a blob into a tensor on ``device``.

    ``dtype`` defaults to the blob's own dtype (bfloat16 included), for raw and int8 alike, since the
    tensor usually goes straight back into a KV cache of that dtype. ``out`` (any device and layout, the
    blob's shape and the resulting dtype) receives the values instead of a new tensor. int8 payloads are
    dequantized on ``device`` (only int8 + scales travel); raw payloads are copied, on CPU straight into
    the tensor's memory.
    """
    header, payload = open_checked(blob, expect=expect)
    target = header.dtype if dtype is None else dtype_name(dtype)
    if target not in TORCH_DTYPES:
        raise CodecError(f"{header.dtype} blobs do not decode to torch tensors (float dtypes only)")
    return header, decode_opened(
        header, payload, target, torch.device(device) if out is None else out.device, out
    )


def open_checked(blob: Buffer, *, expect: Expect = NOTHING) -> tuple[BlobHeader, npt.NDArray[np.uint8]]:
    """Verify a blob (checksums, expectations, an int8 exception table) without decoding it: the header
    and a view of its payload, for :func:`decode_opened`."""
    header, payload = np_blob.open_blob(blob)
    expect.check(header)
    if header.dtype not in TORCH_DTYPES:
        raise CodecError(f"{header.dtype} blobs do not decode to torch tensors (float dtypes only)")
    if header.codec == "int8":
        int8_codec.parse_exceptions(
            payload, int8_codec.Int8Layout(header.value_count, header.group_size), header.dtype_info
        )
    return header, payload


def decode_opened(
    header: BlobHeader,
    payload: npt.NDArray[np.uint8],
    target: str,
    dev: torch.device,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode a blob :func:`open_checked` verified into ``target`` values on ``dev`` (into ``out``)."""
    torch_dtype = TORCH_DTYPES[target]
    if out is not None and (tuple(out.shape) != header.shape or out.dtype != torch_dtype):
        raise CodecError(
            f"out is {out.dtype}{list(out.shape)}, blob decodes to {torch_dtype}{list(header.shape)}"
        )
    if header.codec == "int8":
        return _decode_int8(header, payload, target, dev, out)
    return _decode_raw(header, payload, target, dev, out)


def _decode_int8(
    header: BlobHeader,
    payload: npt.NDArray[np.uint8],
    target: str,
    dev: torch.device,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """Dequantize on ``dev``, straight into ``out`` when it is contiguous."""
    direct = out is not None and out.is_contiguous()
    result = _dequantize(
        header, payload, target, dev, accelerator=dev.type != "cpu", into=out if direct else None
    )
    if out is None or direct:
        return out if out is not None else result
    return out.copy_(result)


def _decode_raw(
    header: BlobHeader,
    payload: npt.NDArray[np.uint8],
    target: str,
    dev: torch.device,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """Copy (converting where ``target`` differs) from the received bytes, on CPU straight into ``out``.

    To an accelerator, values in their own dtype go through pinned memory: one copy on the host, then a
    DMA that runs while the next blob is verified. The bytes of a pageable tensor would be staged by the
    driver and copied synchronously (about 5 GB/s on an H200 host, with the host copy before it).
    """
    on_cpu = out is not None and out.device.type == "cpu"
    if out is not None and on_cpu and target == header.dtype:
        # one copy, straight from the received bytes into (possibly strided) ``out``
        return out.copy_(_payload_view(payload, header))
    if dev.type != "cpu" and target == header.dtype:
        staged = _pinned(payload, header)
        queued = staged.is_pinned()  # only a pinned source is safe to drop while its copy is queued
        if out is None:
            return staged.to(dev, non_blocking=queued)
        return out.copy_(staged, non_blocking=queued)
    direct = out is not None and on_cpu and out.is_contiguous()
    host = out if direct and out is not None else torch.empty(header.shape, dtype=TORCH_DTYPES[target])
    np_blob.decode_payload(header, payload, dtype_info(target), out=numpy_view(host))
    if direct:
        return host
    result = host.to(dev)
    return result if out is None else out.copy_(result)
