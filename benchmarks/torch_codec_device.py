"""The torch codec on a device (a GPU when there is one): encode and decode against a bare copy.

On a GPU engine a store encodes blocks that live in device memory and a restore decodes blobs into the
cache there. For ``--blocks`` KV blocks of one model's shape (default: Llama-3-8B, 16 tokens, bfloat16,
2 MiB a block), each codec is timed against the bare copy of the same tensors between host and device:

- ``encode``: ``encode_tensor`` of every block on the device into a blob on the host (int8: quantized on
  the device, only the int8 values and scales cross to the host);
- ``decode``: ``decode_tensor`` of every blob into a preallocated block on the device (as a restore
  writes its cache; int8: only int8 and scales cross, the multiply runs on the device);
- ``d2h`` / ``h2d``: the blocks' bytes copied device -> host and host -> device, into and from pageable
  host memory as the blobs are, nothing else; ``d2h pinned`` / ``h2d pinned`` the same from pinned
  memory, the DMA's own rate (the raw codec stages through pinned memory, so this is its ceiling).

Contenders alternate, each once per round; rates are GB/s of the blocks' own bytes (the values in their
dtype), medians of ``--rounds``; the ratios set each codec against the copy it replaces. Every blob is
checked equal to the one the CPU makes of the same values, and every decoded block equal to the CPU's
decode of the blob, so a device path that computes other bits fails the run. Run:

    python -m benchmarks.torch_codec_device [--device cuda] [--blocks 32] [--rounds 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.interleave import interleaved
from tierkv.codec.torch_codec import decode_tensor, encode_tensor

SHAPES: dict[str, tuple[int, ...]] = {
    "llama3-8b": (32, 2, 8, 16, 128),
    "qwen2.5-0.5b": (24, 2, 2, 16, 64),
    "tiny": (2, 2, 2, 16, 32),
}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
CODECS = ("raw", "int8")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_blocks(
    shape: tuple[int, ...], dtype: torch.dtype, n: int, device: torch.device
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(shape, generator=g) * 2.0).to(dtype).to(device) for _ in range(n)]


def check_bits(blocks: list[torch.Tensor], codec: str) -> list[bytes]:
    """The device's blobs, each checked against the CPU's blob of the same values, and their decodes
    checked against the CPU's decode; raises AssertionError on the first difference."""
    blobs = []
    for i, block in enumerate(blocks):
        blob = encode_tensor(block, codec)
        if blob != encode_tensor(block.cpu(), codec):
            raise AssertionError(
                f"{codec}: block {i} encodes to other bytes on {block.device} than on the CPU"
            )
        _, on_device = decode_tensor(blob, device=block.device)
        _, on_cpu = decode_tensor(blob)
        if not torch.equal(on_device.cpu().view(torch.uint8), on_cpu.view(torch.uint8)):
            raise AssertionError(
                f"{codec}: block {i} decodes to other bits on {block.device} than on the CPU"
            )
        blobs.append(blob)
    return blobs


def contenders(blocks: list[torch.Tensor], device: torch.device) -> dict[str, Callable[[], None]]:
    """Every timed operation, each a complete pass over the blocks that ends when the device is done."""
    slots = [torch.empty_like(b) for b in blocks]
    host = [torch.empty(b.numel() * b.element_size(), dtype=torch.uint8) for b in blocks]
    pinned = [torch.empty_like(h, pin_memory=device.type == "cuda") for h in host]
    blobs = {codec: check_bits(blocks, codec) for codec in CODECS}

    def encode(codec: str) -> Callable[[], None]:
        def run() -> None:
            for b in blocks:
                encode_tensor(b, codec)

        return run

    def decode(codec: str) -> Callable[[], None]:
        def run() -> None:
            for blob, slot in zip(blobs[codec], slots, strict=True):
                decode_tensor(blob, device=device, out=slot)
            sync(device)

        return run

    def d2h(to: list[torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            for b, h in zip(blocks, to, strict=True):
                h.copy_(b.view(-1).view(torch.uint8))
            sync(device)

        return run

    def h2d(src: list[torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            for h, slot in zip(src, slots, strict=True):
                slot.view(-1).view(torch.uint8).copy_(h, non_blocking=True)
            sync(device)

        return run

    runs: dict[str, Callable[[], None]] = {
        "d2h": d2h(host),
        "h2d": h2d(host),
        "d2h pinned": d2h(pinned),
        "h2d pinned": h2d(pinned),
    }
    for codec in CODECS:
        runs[f"encode {codec}"] = encode(codec)
        runs[f"decode {codec}"] = decode(codec)
    return runs


def summarize(rates: dict[str, list[float]]) -> dict[str, Any]:
    """Median rates, and each codec's median per-round ratio to the copy it replaces."""
    out: dict[str, Any] = {"gbps": {name: statistics.median(v) for name, v in rates.items()}, "vs_copy": {}}
    for codec in CODECS:
        for op, copy in (("encode", "d2h"), ("decode", "h2d")):
            pairs = zip(rates[f"{op} {codec}"], rates[copy], strict=True)
            out["vs_copy"][f"{op} {codec}"] = statistics.median(a / b for a, b in pairs)
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    args = parser.parse_args()
    device = torch.device(args.device)
    shape = SHAPES[args.shape]
    blocks = make_blocks(shape, DTYPES[args.dtype], args.blocks, device)
    nbytes = sum(b.numel() * b.element_size() for b in blocks)
    result = summarize(interleaved(contenders(blocks, device), nbytes, args.rounds))
    report = {
        "device": device_name(device),
        "torch": torch.__version__,
        "shape": args.shape,
        "dtype": args.dtype,
        "blocks": args.blocks,
        "block_bytes": nbytes // args.blocks,
        "rounds": args.rounds,
        "bits_checked": True,
        **result,
    }
    if args.json:
        print(json.dumps(report))
        return
    print(
        f"{report['device']}, torch {report['torch']}: {args.blocks} blocks of {args.shape} "
        f"{shape} {args.dtype} ({report['block_bytes'] / 2**20:.2f} MiB each); medians of {args.rounds} "
        "rounds, GB/s of the blocks' bytes; blobs and decodes checked equal to the CPU's"
    )
    for name, gbps in report["gbps"].items():
        ratio = report["vs_copy"].get(name)
        print(f"  {name:<12} {gbps:7.2f} GB/s" + (f"  {ratio:5.2f}x the bare copy" if ratio else ""))


if __name__ == "__main__":
    main()
