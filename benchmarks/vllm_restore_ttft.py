"""Time to first token in a real vLLM engine (CPU): full prefill vs restore from a vault vs vLLM's own cache.

For each prompt length, every run uses a fresh prompt and measures, on one in-process engine running
TierKVConnector against a real vault process on 127.0.0.1:

- ``prefill``: nothing cached anywhere, the whole prompt is computed;
- ``restore``: the same prompt after vLLM's prefix cache was emptied, its blocks come from the vault
  (asynchronous lookup, one BatchGet, checksum, decode, write into the paged cache);
- ``local``: the same prompt again, served by vLLM's own prefix cache (the floor for any restore).

- ``wire``: the bare data plane in the same run: one ``get_buffers`` of as many blobs of the same size
  and codec, stored just before (as the restore's were), from the same vault, through the same client,
  nothing decoded or written.

Medians over ``--runs`` and the prefill/restore ratio are printed (``--json`` for machines), with the
bound a restore should meet, ``local + 1.5 x wire``, and where a restore's time beyond ``local`` goes,
from the connector's own timers: the scheduler waiting for the lookup, the load's get (blobs are
verified and copied into the cache as they arrive, so that overlaps the transfer), verifying, copying,
the garbage collector's extra time, and the rest (engine steps and scheduling). The bound is also
checked run by run (each run's restore, local and wire are measured back to back): on a busy machine the
medians of separate series drift apart more than a run's own three measurements do. TTFT is the wall
time of an offline request for one output token. Run from the repository root with the vLLM environment
(scripts/setup-vllm-env.sh):

    .venv-vllm/bin/python -m benchmarks.vllm_restore_ttft [--model small|medium] [--runs 5]
        [--lengths 256,960,2048] [--load-mode async|sync] [--codec raw|int8] [--link 5gbe]

``--link`` (root) puts the vault behind an emulated link (:mod:`tierkv.bench.link`: the vault in one
network namespace, the engine in another, a veth shaped to the rate between them). Only a rate is
emulated here: the connector's requests do not wait a round trip, so ``RATE,RTT`` is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import tempfile
import time
from collections import defaultdict
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
from tierkv.bench.link import LinkSpec, link_emulator, parse_link
from tierkv.errors import BenchError
from tierkv.vault.launcher import VaultProcess

MODELS: dict[str, dict[str, int]] = {
    "small": {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32},
    "medium": {"layers": 8, "hidden": 512, "heads": 8, "kv_heads": 4, "head_dim": 64},
}


def kv_bytes_per_token(shape: dict[str, int]) -> int:
    return shape["layers"] * 2 * shape["kv_heads"] * shape["head_dim"] * 4  # float32 K and V


TIMERS = ("lookup_wait_us", "lookup_us", "load_us", "load_get_us", "load_verify_us", "load_copy_us")
"""The connector's timers read around each restore (microseconds)."""


class Wire:
    """The bare data plane: blobs the size of one restore's, read back through the connector's client.

    Each read is of blobs stored just before it under keys of their own, as a restore reads blocks
    stored shortly before: the vault reads fresh LMDB pages then, which costs it more than reading the
    same blobs again (1–2 ms more for 33 MB here).
    """

    def __init__(self, address: str, shape: dict[str, int], codec: str = "raw") -> None:
        from tierkv.client.cluster import Cluster

        self.codec = codec
        self.cluster = Cluster({"kv_cold": [address]})
        self.block = (shape["layers"], shape["kv_heads"], BLOCK_SIZE, 2 * shape["head_dim"])
        self.blobs: dict[int, list[bytes]] = {}
        self.reads = 0

    def stage(self, blocks: int) -> None:
        import torch

        from tierkv.codec.torch_codec import encode_tensor

        self.blobs[blocks] = [
            encode_tensor(torch.randn(self.block), codec=self.codec, tokens=BLOCK_SIZE) for _ in range(blocks)
        ]

    def read(self, blocks: int) -> float:
        self.reads += 1
        keys = [f"wire-{blocks}-{self.reads}-{i}".encode() for i in range(blocks)]
        assert (
            self.cluster.put(b"bench-wire", dict(zip(keys, self.blobs[blocks], strict=True))).stored == blocks
        )
        start = time.perf_counter()
        got = self.cluster.get_buffers(b"bench-wire", keys)
        took = time.perf_counter() - start
        assert all(b is not None for b in got)
        return took

    def close(self) -> None:
        self.cluster.close()


class GcClock:
    """Seconds this process spent in Python's garbage collector (the engine runs in this process).

    A full collection with vLLM and torch loaded takes milliseconds; one that falls inside a restore
    (and not inside the ``local`` run it is compared with) shows as time beyond ``local``.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def close(self) -> None:
        gc.callbacks.remove(self._tick)


def measure(llm: Any, wire: Wire, lengths: list[int], runs: int) -> list[dict[str, Any]]:
    rows = []
    clock = GcClock()
    timed(llm, prompt(999, 64))  # warm-up: first-call kernels
    drain(llm)
    for length in lengths:
        blocks = (length - 1) // BLOCK_SIZE
        wire.stage(blocks)
        samples: dict[str, list[float]] = defaultdict(list)
        for run in range(runs):
            tokens = prompt(length * 1000 + run, length)
            samples["prefill"].append(timed(llm, tokens))
            drain(llm)
            assert llm.reset_prefix_cache()
            before, gc_before = connector_totals(llm), clock.seconds
            samples["restore"].append(timed(llm, tokens))
            after, gc_restore = connector_totals(llm), clock.seconds - gc_before
            drain(llm)
            gc_before = clock.seconds
            samples["local"].append(timed(llm, tokens))
            samples["gc_extra"].append(gc_restore - (clock.seconds - gc_before))
            drain(llm)
            samples["wire"].append(wire.read(blocks))
            restored = after["restored_blocks"] - before["restored_blocks"]
            assert restored == blocks, f"expected a full restore, got {restored} blocks"
            for name in TIMERS:
                samples[name].append((after[name] - before[name]) / 1e6)
            samples["bytes"].append(after["restored_bytes"] - before["restored_bytes"])
        rows.append(summarize(length, samples))
    clock.close()
    return rows


def summarize(length: int, samples: dict[str, list[float]]) -> dict[str, Any]:
    """Medians of one length, the bound and the breakdown of a restore beyond ``local``.

    The bound is checked on the medians (``within_bound``) and run by run: each run's restore, local and
    wire are measured back to back, so its own margin (``restore - local - 1.5 x wire``) is spared the
    drift of a busy machine between runs (``runs_within_bound``, ``paired_margin_ms``, the median).
    """
    med = {k: statistics.median(v) for k, v in samples.items()}
    ms = {k: round(v * 1000, 2) for k, v in med.items() if k != "bytes"}
    bound = med["local"] + 1.5 * med["wire"]
    other = med["restore"] - med["local"] - med["lookup_wait_us"] - med["load_us"]
    runs = list(
        zip(*(samples[k] for k in ("restore", "local", "wire", "lookup_wait_us", "load_us")), strict=True)
    )
    margins = [r - lo - 1.5 * w for r, lo, w, _, _ in runs]
    return {
        "tokens": length,
        **{f"{k}_ms": ms[k] for k in ("prefill", "restore", "local", "wire")},
        "restored_bytes": int(med["bytes"]),
        "wire_gbps": round(med["bytes"] / med["wire"] / 1e9, 2),
        "bound_ms": round(bound * 1000, 2),
        "within_bound": med["restore"] <= bound,
        "runs_within_bound": sum(m <= 0 for m in margins),
        "paired_margin_ms": round(statistics.median(margins) * 1000, 2),
        "prefill_over_restore": round(med["prefill"] / med["restore"], 2),
        "breakdown_ms": {
            "lookup_wait": ms["lookup_wait_us"],
            "lookup": ms["lookup_us"],
            "load": ms["load_us"],
            "load_get": ms["load_get_us"],
            "verify": ms["load_verify_us"],
            "copy": ms["load_copy_us"],
            "gc_extra": ms["gc_extra"],
            "steps_and_other": round(other * 1000, 2),
        },
        "runs_ms": {
            **{k: [round(v * 1000, 2) for v in samples[k]] for k in ("restore", "local", "wire", "gc_extra")},
            "steps_and_other": [round((r - lo - lw - ld) * 1000, 2) for r, lo, _, lw, ld in runs],
        },
    }


def _rate_only(text: str) -> LinkSpec:
    try:
        spec = parse_link(text)
    except BenchError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if spec.rtt_s:
        raise argparse.ArgumentTypeError(
            "only a rate is emulated for an engine (its requests wait no round trip)"
        )
    return spec


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="medium")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lengths", default="256,960")
    parser.add_argument("--load-mode", choices=["async", "sync"], default="async")
    parser.add_argument("--codec", choices=["raw", "int8"], default="raw")
    parser.add_argument("--link", type=_rate_only, help="a link preset or RATE (1gbe, 5gbit); needs root")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    shape = MODELS[args.model]
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        host, prefix = "127.0.0.1", ()
        if args.link is not None:
            link = stack.enter_context(link_emulator(args.link))
            host, prefix = link.vault_host, link.vault_prefix
        max_len = max(lengths) + 64
        model = write_tiny_llama(Path(tmp) / "model", **shape, max_positions=max_len)
        vault = stack.enter_context(
            VaultProcess(Path(tmp) / "vault", host=host, max_bytes="1GiB", prefix=prefix)
        )
        if args.link is not None:
            stack.enter_context(link.engine_side())  # the engine, its threads and the wire client
        wire = Wire(vault.address, shape, args.codec)
        stack.callback(wire.close)
        extra = {"kv_cold": vault.address, "load_mode": args.load_mode, "codec": args.codec}
        llm = make_llm(model, extra, max_model_len=max_len)
        try:
            rows = measure(llm, wire, lengths, args.runs)
            totals = connector_totals(llm)
        finally:
            shutdown(llm)
    if args.json:
        report = {"model": args.model, "load_mode": args.load_mode, "codec": args.codec, "shape": shape}
        report["link"] = args.link.as_dict() if args.link is not None else "loopback"
        report["rows"] = rows
        print(json.dumps({**report, "counters": totals}))
        return
    print_report(args, shape, rows, totals)


def print_report(
    args: argparse.Namespace, shape: dict[str, int], rows: list[dict[str, Any]], totals: Any
) -> None:
    kib = kv_bytes_per_token(shape) * BLOCK_SIZE / 1024
    print(f"model {args.model} {shape}, block {BLOCK_SIZE} tokens = {kib:.0f} KiB of float32 KV")
    print(f"vault over {args.link.label() if args.link is not None else 'loopback'}")
    print(
        f"{args.load_mode} loads, {args.codec} blobs, medians of {args.runs} runs; bound = local + 1.5 x wire"
    )
    print(
        f"{'tokens':>7} {'prefill ms':>11} {'restore ms':>11} {'local ms':>9} {'wire ms':>8} {'GB/s':>5}"
        f" {'bound ms':>9} {'met':>4} {'runs met':>9} {'margin ms':>10} {'prefill/restore':>16}"
    )
    for r in rows:
        print(
            f"{r['tokens']:>7} {r['prefill_ms']:>11.1f} {r['restore_ms']:>11.1f} {r['local_ms']:>9.1f}"
            f" {r['wire_ms']:>8.1f} {r['wire_gbps']:>5.2f} {r['bound_ms']:>9.1f}"
            f" {'yes' if r['within_bound'] else 'no':>4} {r['runs_within_bound']:>4}/{args.runs:<4}"
            f" {r['paired_margin_ms']:>10.1f} {r['prefill_over_restore']:>16.2f}"
        )
    print("runs met: runs whose restore <= local + 1.5 x wire of the same run; margin: the median of")
    print("restore - local - 1.5 x wire over runs (negative: within the bound)")
    print("where a restore's time beyond local goes (ms; get overlaps verify and copy):")
    for r in rows:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in r["breakdown_ms"].items())
        print(f"{r['tokens']:>7}: {parts}")
    print(f"load errors {totals['load_errors']}, restored bytes {totals['restored_bytes']}")


if __name__ == "__main__":
    main()
