"""Codec throughput and quality: numpy vs torch-cpu, float16 and bfloat16, raw and int8.

Throughput is GB/s of *input* (the values in their original dtype), the median of ``--runs`` timed runs
after one warm-up, for a small KV block (24 layers x 2 x 2 KV heads x 16 tokens x 64, 192 KiB in 16-bit)
and a large one (32 x 2 x 8 x 16 x 128, 2 MiB). Decoding is measured to the codec's default output
(numpy int8 -> float32, torch -> the blob dtype) and, for numpy, also back to the blob dtype
("dec native"). A naive numpy int8 (astype, abs-max, divide, rint) is the baseline the fast path is
compared with. Quality is SNR (dB) and max |error| of int8 on Gaussian data. torch runs with 1 thread
and with its default (all cores): on a machine whose other cores are busy, multi-threaded torch ops can
stall on their thread barrier, so compare both; ``--decode-threads`` does the same for numpy's int8
decode (:func:`tierkv.codec.int8.set_decode_threads`). The last lines set the slowest encode, decode and
int8 restore decode (into the blob dtype, as a restore writes it) against the bulk data plane measured in
the same run (BatchGet of a loopback vault). Run:

    python benchmarks/codec_bench.py [--json] [--runs N] [--torch-threads 1,2] [--decode-threads 1,2]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from tierkv.codec import decode, encode, int8, max_abs_error, snr_db
from tierkv.codec.bits import bf16_bits_to_f32, f32_to_bf16_bits

SHAPES = {"192KiB": (24, 2, 2, 16, 64), "2MiB": (32, 2, 8, 16, 128)}


@dataclass
class Row:
    impl: str
    dtype: str
    codec: str
    size: str
    encode_gbs: float
    decode_gbs: float
    decode_native_gbs: float | None
    blob_ratio: float
    snr_db: float | None
    max_abs_err: float | None


def median_gbs(fn: Callable[[], object], nbytes: int, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def gaussian(shape: tuple[int, ...], dtype: str) -> npt.NDArray[Any]:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return f32_to_bf16_bits(x) if dtype == "bfloat16" else x.astype(dtype)


def as_f32(x: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.float32]:
    return bf16_bits_to_f32(x) if dtype == "bfloat16" else x.astype(np.float32)


def naive_int8(x: npt.NDArray[np.float16], group: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """The obvious numpy quantizer (the ~0.3 GB/s baseline of the performance notes)."""
    xf = x.astype(np.float32).reshape(-1, group)
    scale = np.abs(xf).max(axis=1) / np.float32(127)
    q = np.rint(xf / np.where(scale == 0, 1, scale)[:, None]).astype(np.int8)
    return scale, q


def naive_dequant(scale: npt.NDArray[Any], q: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    return np.asarray(q.astype(np.float32) * scale[:, None], np.float32)


def bench_numpy(runs: int, label: str = "numpy") -> list[Row]:
    rows = []
    for size, shape in SHAPES.items():
        for dtype in ("float16", "bfloat16"):
            x = gaussian(shape, dtype)
            kw: dict[str, Any] = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
            for codec in ("raw", "int8"):
                blob = encode(x, codec, **kw)
                _, y = decode(blob)
                lossy = codec == "int8"
                rows.append(
                    Row(
                        impl=label,
                        dtype=dtype,
                        codec=codec,
                        size=size,
                        encode_gbs=median_gbs(partial(encode, x, codec, **kw), x.nbytes, runs),
                        decode_gbs=median_gbs(partial(decode, blob), x.nbytes, runs),
                        decode_native_gbs=median_gbs(partial(decode, blob, out_dtype=dtype), x.nbytes, runs),
                        blob_ratio=len(blob) / x.nbytes,
                        snr_db=snr_db(as_f32(x, dtype), y) if lossy else None,
                        max_abs_err=max_abs_error(as_f32(x, dtype), y) if lossy else None,
                    )
                )
        x16 = gaussian(shape, "float16")
        group = shape[-1]
        scale, q = naive_int8(x16, group)
        rows.append(
            Row(
                impl="numpy-naive",
                dtype="float16",
                codec="int8",
                size=size,
                encode_gbs=median_gbs(partial(naive_int8, x16, group), x16.nbytes, runs),
                decode_gbs=median_gbs(partial(naive_dequant, scale, q), x16.nbytes, runs),
                decode_native_gbs=None,
                blob_ratio=(q.nbytes + scale.nbytes) / x16.nbytes,
                snr_db=snr_db(x16, naive_dequant(scale, q).reshape(shape)),
                max_abs_err=max_abs_error(x16, naive_dequant(scale, q).reshape(shape)),
            )
        )
    return rows


def bench_torch(runs: int, label: str) -> list[Row]:
    import torch

    from tierkv.codec.torch_codec import decode_tensor, encode_tensor

    rows = []
    for size, shape in SHAPES.items():
        for dtype, tdtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
            t = torch.from_numpy(np.random.default_rng(0).standard_normal(shape).astype(np.float32)).to(
                tdtype
            )
            nbytes = t.numel() * t.element_size()
            for codec in ("raw", "int8"):
                blob = encode_tensor(t, codec)
                _, y = decode_tensor(blob, dtype=torch.float32)
                lossy = codec == "int8"
                ref = t.float().numpy()
                rows.append(
                    Row(
                        impl=label,
                        dtype=dtype,
                        codec=codec,
                        size=size,
                        encode_gbs=median_gbs(partial(encode_tensor, t, codec), nbytes, runs),
                        decode_gbs=median_gbs(partial(decode_tensor, blob), nbytes, runs),
                        decode_native_gbs=None,
                        blob_ratio=len(blob) / nbytes,
                        snr_db=snr_db(ref, y.numpy()) if lossy else None,
                        max_abs_err=max_abs_error(ref, y.numpy()) if lossy else None,
                    )
                )
    return rows


def data_plane_gbs(runs: int) -> float:
    """BatchGet throughput of a real loopback vault in this run, for 64 MiB of 192 KiB blobs."""
    import tempfile

    from tierkv import VaultClient
    from tierkv.vault.launcher import VaultProcess

    blob = os.urandom(192 * 1024)
    keys = [i.to_bytes(8, "big") for i in range(64 * 1024 * 1024 // len(blob))]
    with (
        tempfile.TemporaryDirectory() as tmp,
        VaultProcess(f"{tmp}/vault", max_bytes="256MiB") as vault,
        VaultClient(vault.address, timeout=30) as client,
    ):
        client.put(b"bench", dict.fromkeys(keys, blob))
        return median_gbs(partial(client.get_buffers, b"bench", keys), len(keys) * len(blob), runs)


def model_kv_quality() -> dict[str, float]:
    """int8 SNR / max error on KV produced by a transformers model (random weights: no download)."""
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=32000,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=4,
        num_attention_heads=14,
        num_key_value_heads=2,
    )
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        out = model(torch.randint(0, 32000, (1, 512)), use_cache=True)
    layers = out.past_key_values.layers
    kv = torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in layers])
    bits = kv.contiguous().view(torch.int16).numpy().view(np.uint16)
    ref = bf16_bits_to_f32(bits)
    _, back = decode(encode(bits, codec="int8", dtype="bfloat16"))
    return {
        "kv_values": float(ref.size),
        "snr_db": snr_db(ref, back),
        "max_abs_err": max_abs_error(ref, back),
        "max_abs_value": float(np.abs(ref).max()),
    }


def restore_gbs(row: Row) -> float:
    """Decode rate into the blob dtype (what a restore writes): numpy's "dec native", torch's "dec"."""
    return row.decode_native_gbs if row.decode_native_gbs is not None else row.decode_gbs


def print_summary(rows: list[Row], plane: float) -> None:
    """The slowest encode and decode, and each implementation's slowest int8 restore decode, against the
    data plane of this run."""
    real = [r for r in rows if r.impl != "numpy-naive"]  # the naive rows are the baseline, not a path
    for what, speed in (("encode (store)", "encode_gbs"), ("decode (restore)", "decode_gbs")):
        slow = min(real, key=lambda r: getattr(r, speed))
        print(
            f"slowest {what}: {slow.impl} {slow.dtype} {slow.codec} {slow.size} at {getattr(slow, speed):.2f} "
            f"GB/s = {getattr(slow, speed) / plane:.1f}x the loopback data plane ({plane:.2f} GB/s, BatchGet "
            f"of 192 KiB blobs, this run)"
        )
    for impl in dict.fromkeys(r.impl for r in real):
        restore = [(r, restore_gbs(r)) for r in real if r.impl == impl and r.codec == "int8"]
        slow, gbs = min(restore, key=lambda pair: pair[1])
        print(
            f"int8 restore decode ({impl}, into the blob dtype): slowest {slow.dtype} {slow.size} at {gbs:.2f} "
            f"GB/s = {gbs / plane:.2f}x the data plane"
        )


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[Row], info: dict[str, Any]) -> None:
    print(
        f"codec throughput, GB/s of input, median of {info['runs']} runs "
        f"(cores: {info['cpu_count']}; torch xN = N intra-op threads)"
    )
    head = (
        f"{'impl':<12}{'dtype':<10}{'codec':<6}{'size':>7}{'enc':>8}{'dec':>8}"
        f"{'dec native':>11}{'blob/in':>9}{'SNR dB':>8}{'max|err|':>10}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.impl:<12}{r.dtype:<10}{r.codec:<6}{r.size:>7}{r.encode_gbs:>8.2f}{r.decode_gbs:>8.2f}"
            f"{fmt(r.decode_native_gbs, '.2f'):>11}{r.blob_ratio:>9.3f}{fmt(r.snr_db, '.1f'):>8}"
            f"{fmt(r.max_abs_err, '.4f'):>10}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--runs", type=int, default=30, help="timed runs per figure (median reported)")
    parser.add_argument(
        "--torch-threads",
        default="",
        help="comma-separated torch intra-op thread counts to run (default: 1 and torch's default)",
    )
    parser.add_argument(
        "--decode-threads",
        default="1",
        help="comma-separated thread counts for numpy's int8 decode (default: 1, the library default)",
    )
    args = parser.parse_args()
    rows: list[Row] = []
    decode_threads = [int(n) for n in args.decode_threads.split(",") if n]
    for n in decode_threads:
        int8.set_decode_threads(n)
        rows += bench_numpy(args.runs, "numpy" if n == 1 else f"numpy x{n}")
    int8.set_decode_threads(1)
    torch_threads: list[int] = []
    torch_version: str | None = None
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        print("torch is not installed: torch-cpu rows skipped")
    else:
        default_threads = torch.get_num_threads()
        torch_threads = [int(n) for n in args.torch_threads.split(",") if n] or sorted({1, default_threads})
        torch_version = torch.__version__
        for n in torch_threads:
            torch.set_num_threads(n)
            rows += bench_torch(args.runs, f"torch x{n}")
        torch.set_num_threads(default_threads)
    info = {
        "runs": args.runs,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch_threads,
        "decode_threads": decode_threads,
        "numpy": np.__version__,
        "torch": torch_version,
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    plane = data_plane_gbs(max(3, args.runs // 5))
    real_kv = model_kv_quality() if torch_version else None
    if args.json:
        print(
            json.dumps(
                {
                    "info": info,
                    "rows": [asdict(r) for r in rows],
                    "data_plane_gbs": plane,
                    "model_kv_int8": real_kv,
                },
                indent=2,
            )
        )
        return
    print_table(rows, info)
    print_summary(rows, plane)
    if real_kv:
        print(
            f"int8 on KV from a random-weight Qwen2-shaped transformers model (bf16, 4 layers, 512 tokens): "
            f"SNR {real_kv['snr_db']:.1f} dB, max |err| {real_kv['max_abs_err']:.4f} "
            f"(max |value| {real_kv['max_abs_value']:.2f})"
        )


if __name__ == "__main__":
    main()
