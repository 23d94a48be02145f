"""Time to first token in a real vLLM engine (CPU): full prefill vs restore from a vault vs vLLM's own cache.

For each prompt length, every run uses a fresh prompt and measures, on one in-process engine running
TierKVConnector against a real vault process on 127.0.0.1:

- ``prefill``: nothing cached anywhere, the whole prompt is computed;
- ``restore``: the same prompt after vLLM's prefix cache was emptied, its blocks come from the vault
  (asynchronous lookup, one BatchGet, checksum, decode, write into the paged cache);
- ``local``: the same prompt again, served by vLLM's own prefix cache (the floor for any restore).

Medians over ``--runs`` and the prefill/restore ratio are printed (``--json`` for machines). TTFT is the
wall time of an offline request for one output token. Run from the repository root with the vLLM
environment (scripts/setup-vllm-env.sh):

    .venv-vllm/bin/python -m benchmarks.vllm_restore_ttft [--model small|medium] [--runs 5] [--lengths 256,960]
        [--load-mode async|sync]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tests.connectors.vllm.engine import (
    BLOCK_SIZE,
    connector_totals,
    drain,
    make_llm,
    prompt,
    shutdown,
    timed,
    write_tiny_llama,
)
from tierkv.vault.launcher import VaultProcess

MODELS: dict[str, dict[str, int]] = {
    "small": {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32},
    "medium": {"layers": 8, "hidden": 512, "heads": 8, "kv_heads": 4, "head_dim": 64},
}


def kv_bytes_per_token(shape: dict[str, int]) -> int:
    return shape["layers"] * 2 * shape["kv_heads"] * shape["head_dim"] * 4  # float32 K and V


def measure(llm: Any, lengths: list[int], runs: int) -> list[dict[str, Any]]:
    rows = []
    timed(llm, prompt(999, 64))  # warm-up: first-call kernels
    drain(llm)
    for length in lengths:
        samples: dict[str, list[float]] = {"prefill": [], "restore": [], "local": []}
        for run in range(runs):
            tokens = prompt(length * 1000 + run, length)
            before = connector_totals(llm)["restored_blocks"]
            samples["prefill"].append(timed(llm, tokens))
            drain(llm)
            assert llm.reset_prefix_cache()
            samples["restore"].append(timed(llm, tokens))
            drain(llm)
            samples["local"].append(timed(llm, tokens))
            drain(llm)
            restored = connector_totals(llm)["restored_blocks"] - before
            assert restored == (length - 1) // BLOCK_SIZE, f"expected a full restore, got {restored} blocks"
        med = {k: statistics.median(v) for k, v in samples.items()}
        rows.append(
            {
                "tokens": length,
                **{f"{k}_ms": round(v * 1000, 2) for k, v in med.items()},
                "prefill_over_restore": round(med["prefill"] / med["restore"], 2),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="medium")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lengths", default="256,960")
    parser.add_argument("--load-mode", choices=["async", "sync"], default="async")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    shape = MODELS[args.model]
    with tempfile.TemporaryDirectory() as tmp:
        max_len = max(lengths) + 64
        model = write_tiny_llama(Path(tmp) / "model", **shape, max_positions=max_len)
        vault = VaultProcess(Path(tmp) / "vault", max_bytes="1GiB").start()
        try:
            extra = {"kv_cold": vault.address, "load_mode": args.load_mode}
            llm = make_llm(model, extra, max_model_len=max_len)
            try:
                rows = measure(llm, lengths, args.runs)
                totals = connector_totals(llm)
            finally:
                shutdown(llm)
        finally:
            vault.stop()
    if args.json:
        report = {"model": args.model, "load_mode": args.load_mode, "shape": shape, "rows": rows}
        print(json.dumps({**report, "counters": totals}))
        return
    kib = kv_bytes_per_token(shape) * BLOCK_SIZE / 1024
    print(f"model {args.model} {shape}, block {BLOCK_SIZE} tokens = {kib:.0f} KiB of float32 KV")
    print(f"{args.load_mode} loads, medians of {args.runs} runs")
    print(f"{'tokens':>7} {'prefill ms':>11} {'restore ms':>11} {'local ms':>9} {'prefill/restore':>16}")
    for r in rows:
        print(
            f"{r['tokens']:>7} {r['prefill_ms']:>11.1f} {r['restore_ms']:>11.1f} {r['local_ms']:>9.1f}"
            f" {r['prefill_over_restore']:>16.2f}"
        )
    print(f"load errors {totals['load_errors']}, restored bytes {totals['restored_bytes']}")


if __name__ == "__main__":
    main()
