"""Decode a restore's blobs into consecutive rows of one tensor, int8 runs on CPU in one pass.

Decoding blob by blob costs an int8 restore on CPU far more than its arithmetic: for a 256 KiB block of
float32 KV (64 Ki values) :func:`~tierkv.codec.torch_codec.decode_tensor` took ~190 µs on this project's
2-core test machine, its widen-and-scale ~26 µs; the rest is a dozen torch and Python calls per blob.
Here every blob is verified first (checksums, expectations, exception table), then each run of good int8
blobs that share a layout (value count, group size, dtype, no exception table) has its group regions
copied into one staging array and is dequantized by :func:`~tierkv.codec.torch_codec.scale_groups` in one
go: the same arithmetic, so the same bits, with a few calls per run instead of per blob. Everything else
(raw blobs, exception tables, a tensor on an accelerator) decodes blob by blob as before.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from tierkv.codec.expect import NOTHING, Expect
from tierkv.codec.header import SCALE_BYTES, BlobHeader, Buffer, int8_groups_len
from tierkv.codec.torch_codec import decode_opened, dtype_name, open_checked, scale_groups
from tierkv.errors import TierKVError

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
    verdicts: list[TierKVError | None] = []
    good: list[Opened] = []
    for blob in blobs:
        try:
            good.append(open_checked(blob, expect=expect))
        except TierKVError as exc:
            verdicts.append(exc)
        else:
            verdicts.append(None)
    target = dtype_name(into.dtype)
    batched = into.device.type == "cpu" and into.is_contiguous()
    for start, run in _runs(good, batched):
        if len(run) > 1:
            _dequantize_run(run, into.narrow(0, start, len(run)))
        else:
            decode_opened(*run[0], target, into.device, into[start])
    return verdicts


def _runs(good: list[Opened], batched: bool) -> list[tuple[int, list[Opened]]]:
    """``(first row, blobs)``: consecutive good blobs that dequantize together, every other blob alone."""
    runs: list[tuple[int, list[Opened]]] = []
    last = None
    for n, opened in enumerate(good):
        key = _layout_key(*opened) if batched else None
        if key is not None and key == last:
            runs[-1][1].append(opened)
        else:
            runs.append((n, [opened]))
        last = key
    return runs


def _layout_key(header: BlobHeader, payload: npt.NDArray[np.uint8]) -> tuple[int, int, str] | None:
    """What int8 blobs must share to be dequantized as one array; None for a blob that decodes alone."""
    if header.codec != "int8" or header.value_count % header.group_size:
        return None
    if len(payload) != int8_groups_len(header.value_count, header.group_size):
        return None  # an exception table: its groups are overwritten with raw values afterwards
    return header.value_count, header.group_size, header.dtype


def _dequantize_run(run: list[Opened], rows: torch.Tensor) -> None:
    """Stage the group regions of ``run`` side by side and scale them into ``rows`` (contiguous, CPU)."""
    header = run[0][0]
    region = len(run[0][1])
    stage = _staging(len(run) * region)
    for j, (_, payload) in enumerate(run):
        stage[j * region : (j + 1) * region] = payload
    groups = len(run) * (header.value_count // header.group_size)
    records = torch.from_numpy(stage).view(torch.int8).view(groups, SCALE_BYTES + header.group_size)
    scales = records.narrow(1, 0, SCALE_BYTES).contiguous().view(torch.float32)
    q = records.narrow(1, SCALE_BYTES, header.group_size)
    scale_groups(q, scales, rows.view(groups, header.group_size), accelerator=False)


def _staging(size: int) -> npt.NDArray[np.uint8]:
    """This thread's staging bytes (kept between restores, grown as needed), the first ``size`` of them."""
    have: npt.NDArray[np.uint8] | None = getattr(_STAGING, "bytes", None)
    if have is None or have.size < size:
        have = np.empty(size, np.uint8)
        _STAGING.bytes = have
    return have[:size]


__all__ = ["decode_rows"]
