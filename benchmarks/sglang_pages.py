"""SGLang HiCache page store / load through the controller's own page functions: tierkv vs SGLang's
``file`` backend on the same pages, and tierkv's load vs a bare ``get_buffers`` of the same bytes.

Each contender is a real ``HiCacheController`` over real CPU host pools (``io_backend="direct"``), one per
backend: tierkv's ``TierKVStorage`` loaded by module path (``dynamic``) on the zero-copy path
(``interface_v1``) and on the generic path, against one real vault process on 127.0.0.1, and SGLang's
``HiCacheFile`` in a temporary directory (local disk, through the page cache). A store is
``cc.page_set_func`` of ``--pages`` pages (fresh keys every call: the file backend skips keys it has);
a load is ``cc.page_get_func`` of the same ``--pages`` pages into other host pages, as the prefetch-IO
thread calls them. ``get_buffers`` is the vault client's plain batched get of the very blobs a tierkv
load fetches (no verification, nothing written into the pool): what the adapter and pipeline cost on top.
Contenders run interleaved (:mod:`benchmarks.interleave`), medians of ``--repeats`` calls.

Run from the repository root with the SGLang environment (scripts/setup-sglang-env.sh):

    .venv-sglang/bin/python -m benchmarks.sglang_pages [--layout page_first] [--pages 16] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.interleave import rounds
from tests.connectors.sglang.harness import Geometry, Node, fill_random, page_hashes, tierkv_extra
from tierkv.connectors.sglang.pages import page_keys
from tierkv.vault.launcher import VaultProcess


class Bench:
    """One controller and the pages it stores and loads."""

    def __init__(self, node: Node, pages: int) -> None:
        self.node, self.pages = node, pages
        page = node.geo.page
        self.source = node.host.alloc(pages * page)
        self.target = node.host.alloc(pages * page)
        fill_random(node.host, self.source, seed=1)
        self.fresh = itertools.count()
        self.loaded_keys = self.keys(0)
        assert node.cc.page_set_func(self.loaded_keys, self.source, None), "the pages to load were not stored"

    def keys(self, n: int) -> list[str]:
        page = self.node.geo.page
        return page_hashes([n * 1_000_003 + t for t in range(self.pages * page)], page)

    def store(self) -> None:
        assert self.node.cc.page_set_func(self.keys(next(self.fresh) + 1), self.source, None)

    def load(self) -> None:
        from sglang.srt.managers.cache_controller import PrefetchOperation

        op = PrefetchOperation("bench", [])
        got = self.node.cc.page_get_func(op, self.loaded_keys, self.target, None)
        assert got == self.pages, f"{got} of {self.pages} pages loaded"


def medians(times: dict[str, list[float]], nbytes: int, pages: int) -> dict[str, dict[str, float]]:
    return {
        name: {
            "gbps": nbytes / statistics.median(ts) / 1e9,
            "pages_per_s": pages / statistics.median(ts),
            "ms": 1e3 * statistics.median(ts),
        }
        for name, ts in times.items()
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    geo = Geometry(
        page=args.page, layers=args.layers, heads=args.heads, dim=args.dim, tokens=args.pages * args.page
    )
    page_bytes = (
        2 * geo.layers * geo.page * geo.heads * geo.dim * torch.tensor([], dtype=geo.dtype).element_size()
    )
    nbytes = page_bytes * args.pages
    with tempfile.TemporaryDirectory() as tmp:
        vault = VaultProcess(Path(tmp) / "vault", max_bytes=args.vault_bytes).start()
        nodes: list[Node] = []
        try:
            benches = {}
            for name, backend, extra in (
                ("tierkv v1", "dynamic", tierkv_extra([vault.address], v1=True, timeout=30.0)),
                ("tierkv generic", "dynamic", tierkv_extra([vault.address], v1=False, timeout=30.0)),
                ("file", "file", {"file_storage_path": str(Path(tmp) / "file")}),
            ):
                nodes.append(Node(args.layout, backend, extra, geo))
                benches[name] = Bench(nodes[-1], args.pages)
            tierkv = benches["tierkv v1"].node.backend
            blob_keys = page_keys(tierkv.namespace, benches["tierkv v1"].loaded_keys)

            def bare_get() -> None:
                got = tierkv.storage.get_buffers(tierkv.namespace.digest, blob_keys)
                assert all(b is not None for b in got)

            stores: dict[str, Callable[[], object]] = {f"store {n}": b.store for n, b in benches.items()}
            loads: dict[str, Callable[[], object]] = {f"load {n}": b.load for n, b in benches.items()}
            loads["get_buffers (bare)"] = bare_get
            result = {
                "layout": args.layout,
                "page_bytes": page_bytes,
                "pages_per_call": args.pages,
                "repeats": args.repeats,
                "store": medians(rounds(stores, args.repeats), nbytes, args.pages),
                "load": medians(rounds(loads, args.repeats), nbytes, args.pages),
            }
        finally:
            for node in nodes:
                node.close()
            vault.stop()
    return result


def report(result: dict[str, Any]) -> None:
    print(
        f"layout {result['layout']}, {result['pages_per_call']} pages of {result['page_bytes'] / 2**20:.2f} MiB "
        f"per call, medians of {result['repeats']} interleaved calls"
    )
    for op in ("store", "load"):
        base = result[op][f"{op} file"]["gbps"]
        for name, m in result[op].items():
            print(
                f"  {name:22s} {m['gbps']:7.3f} GB/s  {m['pages_per_s']:8.1f} pages/s  {m['ms']:8.2f} ms"
                f"  ({m['gbps'] / base:.2f}x file)"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--layout", default="page_first", choices=("layer_first", "page_first", "page_first_direct")
    )
    p.add_argument("--pages", type=int, default=16, help="pages per store / load call")
    p.add_argument("--page", type=int, default=32, help="tokens per page")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--vault-bytes", default="4GiB")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2)) if args.json else report(result)


if __name__ == "__main__":
    main()
