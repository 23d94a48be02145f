"""Decode a restore's blobs into consecutive rows of one tensor, or each into a slot of its own, int8 runs
on CPU in one pass.

Decoding blob by blob costs an int8 restore on CPU far more than its arithmetic: for a 256 KiB block of
float32 KV (64 Ki values) :func:`~tierkv.codec.torch_codec.decode_tensor` took ~190 µs on this project's
2-core test machine, its widen-and-scale ~26 µs; the rest is a dozen torch and Python calls per blob.
Here every blob is verified first (checksums, expectations, exception table), then each run of good int8
blobs that share a layout (value count, group size, dtype, no exception table) has its group regions
copied into one staging array and is dequantized by :func:`~tierkv.codec.torch_codec.scale_groups` in one
go: the same arithmetic, so the same bits, with a few calls per run instead of per blob. Rows of one
contiguous tensor take the products straight; slots anywhere else (strided views of a cache, rows that
are not neighbours) take them from the float32 scratch one slot at a time, which is the copy a blob by
blob decode into a strided slot makes too. Everything else (raw blobs, exception tables, a tensor on an
accelerator) decodes blob by blob as before.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from tierkv.codec.expect import NOTHING, Expect
from tierkv.codec.header import SCALE_BYTES, BlobHeader, Buffer, int8_groups_len
from tierkv.codec.torch_codec import (
    CPU_DECODE_VALUES,
    cpu_scratch,
    decode_opened,
    dtype_name,
    open_checked,
    scale_groups,
    widened,
)
from tierkv.errors import CodecError, TierKVError

_STAGING = threading.local()

Opened = tuple[BlobHeader, npt.NDArray[np.uint8]]


def decode_rows(
    blobs: Sequence[Buffer], into: torch.Tensor, expect: Expect = NOTHING
) -> list[TierKVError | None]:
    """Verify every blob and decode the n-th good one into ``into[n]``; one verdict per blob (None: good).

    ``expect`` is what every blob's header must say.
    ``into`` holds at least as many rows as there are blobs, each of a blob's shape, in the dtype the
    blobs decode to. Nothing is written for a blob that does not verify.
    """
    verdicts, good = _open(blobs, expect)
    target = dtype_name(into.dtype)
    if into.device.type != "cpu" or not into.is_contiguous():
        _decode_each([(opened, into[n]) for n, (_, opened) in enumerate(good)])
        return verdicts
    for start, run in _runs([(opened, target) for _, opened in good]):
        if len(run) > 1:
            _dequantize_run(run, into.narrow(0, start, len(run)))
        else:
            decode_opened(*run[0], target, into.device, into[start])
    return verdicts


def decode_slots(
    blobs: Sequence[Buffer], slots: Sequence[torch.Tensor], expect: Expect = NOTHING
) -> list[TierKVError | None]:
    """Verify every blob and decode blob ``k`` into ``slots[k]`` (any device and strides, each of a
    blob's shape, in the dtype it decodes to); one verdict per blob (None: good), nothing written to the
    slot of a blob that does not verify or whose slot it does not fit (a :class:`CodecError`, as
    :func:`~tierkv.codec.torch_codec.decode_tensor` raises for such an ``out``)."""
    verdicts, good = _open(blobs, expect)
    fitting = []
    for k, (header, payload) in good:
        misfit = _misfit(header, slots[k])
        if misfit is None:
            fitting.append(((header, payload), slots[k]))
        else:
            verdicts[k] = misfit
    _decode_each(fitting)
    return verdicts


def _misfit(header: BlobHeader, slot: torch.Tensor) -> CodecError | None:
    """Why a verified blob cannot be decoded into ``slot`` (what decoding into it would raise), or None."""
    try:
        dtype_name(slot.dtype)
    except CodecError as exc:
        return exc
    if tuple(slot.shape) != header.shape:
        return CodecError(f"out is {slot.dtype}{list(slot.shape)}, blob decodes to {list(header.shape)}")
    return None


def _open(
    blobs: Sequence[Buffer], expect: Expect
) -> tuple[list[TierKVError | None], list[tuple[int, Opened]]]:
    """Every blob verified: one verdict per blob, and ``(index, opened)`` of the good ones."""
    verdicts: list[TierKVError | None] = []
    good: list[tuple[int, Opened]] = []
    for k, blob in enumerate(blobs):
        try:
            good.append((k, open_checked(blob, expect=expect)))
        except TierKVError as exc:
            verdicts.append(exc)
        else:
            verdicts.append(None)
    return verdicts, good


def _decode_each(pairs: Sequence[tuple[Opened, torch.Tensor]]) -> None:
    """Each verified blob into its own slot: runs of int8 blobs bound for CPU slots scaled together."""
    keyed = [
        (opened, dtype_name(slot.dtype) if slot.device.type == "cpu" else None) for opened, slot in pairs
    ]
    for start, run in _runs(keyed):
        slots = [slot for _, slot in pairs[start : start + len(run)]]
        if len(run) > 1:
            _dequantize_run(run, slots)
        else:
            decode_opened(*run[0], dtype_name(slots[0].dtype), slots[0].device, slots[0])


def _runs(good: Sequence[tuple[Opened, str | None]]) -> list[tuple[int, list[Opened]]]:
    """``(first, blobs)``: consecutive good blobs that dequantize together, every other blob alone. Each
    comes with the dtype it decodes to on CPU (None: it goes elsewhere, so it decodes alone)."""
    runs: list[tuple[int, list[Opened]]] = []
    last = None
    for n, (opened, target) in enumerate(good):
        key = None if target is None else _layout_key(*opened, target)
        if key is not None and key == last:
            runs[-1][1].append(opened)
        else:
            runs.append((n, [opened]))
        last = key
    return runs


def _layout_key(
    header: BlobHeader, payload: npt.NDArray[np.uint8], target: str
) -> tuple[int, int, str, str] | None:
    """What int8 blobs must share to be dequantized as one array; None for a blob that decodes alone."""
    if header.codec != "int8" or header.value_count % header.group_size:
        return None
    if len(payload) != int8_groups_len(header.value_count, header.group_size):
        return None  # an exception table: its groups are overwritten with raw values afterwards
    return header.value_count, header.group_size, header.dtype, target


def _dequantize_run(run: list[Opened], dst: torch.Tensor | Sequence[torch.Tensor]) -> None:
    """Stage the group regions of ``run`` side by side and scale them into ``dst``: rows of one
    contiguous CPU tensor, or one CPU slot per blob."""
    header = run[0][0]
    region = len(run[0][1])
    stage = _staging(len(run) * region)
    for j, (_, payload) in enumerate(run):
        stage[j * region : (j + 1) * region] = payload
    groups = len(run) * (header.value_count // header.group_size)
    records = torch.from_numpy(stage).view(torch.int8).view(groups, SCALE_BYTES + header.group_size)
    scales = records.narrow(1, 0, SCALE_BYTES).contiguous().view(torch.float32)
    q = records.narrow(1, SCALE_BYTES, header.group_size)
    if isinstance(dst, torch.Tensor):
        scale_groups(q, scales, dst.view(groups, header.group_size), accelerator=False)
    else:
        _scale_into_slots(q, scales, dst)


def _scale_into_slots(q: torch.Tensor, scales: torch.Tensor, slots: Sequence[torch.Tensor]) -> None:
    """:func:`scale_groups`'s CPU arithmetic (widen into float32 scratch, scale, round once into the
    slot's dtype: the same bits) in steps of whole blobs, each blob's products copied into its slot."""
    per = q.shape[0] // len(slots)
    width = q.shape[1]
    step = max(1, CPU_DECODE_VALUES // (per * width))
    scratch = cpu_scratch(min(step, len(slots)) * per * width)
    for b0 in range(0, len(slots), step):
        rows = min(step, len(slots) - b0) * per
        wide = widened(q.narrow(0, b0 * per, rows), scales.narrow(0, b0 * per, rows), scratch)
        for j, slot in enumerate(slots[b0 : b0 + rows // per]):
            slot.copy_(wide.narrow(0, j * per, per).view(slot.shape))


def _staging(size: int) -> npt.NDArray[np.uint8]:
    """This thread's staging bytes (kept between restores, grown as needed), the first ``size`` of them."""
    have: npt.NDArray[np.uint8] | None = getattr(_STAGING, "bytes", None)
    if have is None or have.size < size:
        have = np.empty(size, np.uint8)
        _STAGING.bytes = have
    return have[:size]


__all__ = ["decode_rows", "decode_slots"]
