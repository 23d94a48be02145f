"""int8 decode of one restore's blocks: blob by blob (``decode_tensor``) against a run at a time
(``decode_rows``).

Both decoders get the same freshly encoded blocks (the vLLM benchmark's shape by default: 8 layers, 4 KV
heads, 16 tokens, K and V of 64 = 256 KiB of float32 per block) and the same destination buffer; each
round times one decode of every block by each contender (in an order rotated per round), after checking
that both write the same bits. Medians over ``--rounds`` and their ratio are printed. Run from the repository root with torch
installed (``.venv`` or ``.venv-vllm``)::

    .venv/bin/python -m benchmarks.int8_rows_bench [--blocks 127] [--rounds 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import interleave
from tierkv.codec.torch_codec import decode_tensor, encode_tensor
from tierkv.codec.torch_rows import decode_rows

SHAPE = (8, 4, 16, 128)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def contenders(blobs: list[bytes], into: torch.Tensor) -> dict[str, Callable[[], object]]:
    def blob_by_blob() -> None:
        for n, blob in enumerate(blobs):
            decode_tensor(blob, out=into[n])

    def rows() -> None:
        assert decode_rows(blobs, into) == [None] * len(blobs)

    return {"blob_by_blob": blob_by_blob, "rows": rows}


def measure(dtype: torch.dtype, blocks: int, rounds: int) -> dict[str, Any]:
    """Median seconds of each contender over ``rounds`` alternating rounds, and the ratio."""
    gen = torch.Generator().manual_seed(blocks)
    blobs = [encode_tensor(torch.randn(SHAPE, generator=gen).to(dtype), codec="int8") for _ in range(blocks)]
    into = torch.empty((blocks, *SHAPE), dtype=dtype)
    runs = contenders(blobs, into)
    written = []
    for run in runs.values():
        into.fill_(0)
        run()
        written.append(into.clone())
    assert all(torch.equal(w.view(torch.uint8), written[0].view(torch.uint8)) for w in written), "bits differ"
    med = {name: statistics.median(t) for name, t in interleave.rounds(runs, rounds).items()}
    return {
        "ms": {name: round(v * 1e3, 2) for name, v in med.items()},
        "speedup": round(med["blob_by_blob"] / med["rows"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=127)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.blocks} int8 blocks of {SHAPE} values each, {args.threads} torch thread(s)")
    for name, dtype in DTYPES.items():
        got = measure(dtype, args.blocks, args.rounds)
        ms = got["ms"]
        print(
            f"{name:>9}: blob by blob {ms['blob_by_blob']:.2f} ms, rows {ms['rows']:.2f} ms "
            f"({got['speedup']:.2f}x), medians of {args.rounds} alternating rounds"
        )


if __name__ == "__main__":
    main()
