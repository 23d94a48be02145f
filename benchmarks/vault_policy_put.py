"""Put throughput of real vault processes under each eviction policy, contenders interleaved: the cost of
a policy as an engine sees it, wire and all (``policy_put`` measures the store alone, the stricter test).

One vault process per policy (``fast`` sync, the same budget, on loopback, Puts over the bulk port), each
filled past its budget first; then calls of eight Puts of new keys (one engine request's chain each), with
every fourth Put preceded by a lookup and a read of half of the last one, as in ``policy_put``, so
``adaptive`` also promotes, learns and feeds its shadows. Blob sizes 1 KiB, 64 KiB, 1 MiB. Per call, the
client's wall clock and the vault process's own CPU time (``/proc/PID/stat``: what the vault spent on the
call, the client's and other tenants' load apart); the ratio to ``lru`` is the median of the rounds'
ratios, as in ``policy_put``. Linux only (the vault's CPU time comes from ``/proc``). Run:

    python -m benchmarks.vault_policy_put [--repeats 15] [--budget 32MiB] [--policies lru,adaptive] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.bulk_read import process_cpu
from benchmarks.interleave import rounds
from benchmarks.policy_put import BATCHES_PER_CALL, SIZES, Traffic, cpu_timed, paired_ratios
from tierkv import VaultClient
from tierkv.config import parse_size
from tierkv.vault.launcher import VaultProcess


class VaultWorkload(Traffic):
    """``policy_put``'s traffic sent to a vault over the wire."""

    def __init__(self, client: VaultClient, blob: int, per_batch: int, name: str) -> None:
        super().__init__(blob, per_batch, name)
        self.client = client

    def read(self, keys: list[bytes]) -> None:
        self.client.prefix_lookup(b"ns", keys)
        self.client.get(b"ns", keys)

    def write(self, keys: list[bytes]) -> None:
        stored = self.client.put(b"ns", dict.fromkeys(keys, self.data))
        if stored != len(keys):
            raise RuntimeError(f"{self.name}: {stored} of {len(keys)} stored")


def _one_size(
    vaults: dict[str, VaultProcess], blob: int, per_batch: int, budget: int, repeats: int
) -> dict[str, object]:
    clients = {p: VaultClient(v.address, timeout=120) for p, v in vaults.items()}
    try:
        loads = {p: VaultWorkload(c, blob, per_batch, f"{p}/{blob}") for p, c in clients.items()}
        for w in loads.values():
            for _ in range(budget // (blob * per_batch) + 2):
                w.batch()
        cpu: dict[str, list[float]] = {p: [] for p in loads}
        calls: dict[str, Callable[[], object]] = {}
        for p, w in loads.items():
            proc = vaults[p].proc
            assert proc is not None, "started before"
            calls[p] = cpu_timed(w.batches, cpu[p], clock=functools.partial(process_cpu, proc.pid))
        wall = rounds(calls, repeats)
        vault_cpu_times = {p: ts[1:] for p, ts in cpu.items()}  # without the warm-up call
        nbytes = blob * per_batch * BATCHES_PER_CALL
        stats = {p: c.stats() for p, c in clients.items()}
        return {
            "policy": {p: s.policy for p, s in stats.items()},
            "evictions": {p: s.evictions for p, s in stats.items()},
            "gb_per_s": {p: statistics.median(nbytes / t / 1e9 for t in ts) for p, ts in wall.items()},
            "ratio_to_lru": paired_ratios(wall),
            "vault_cpu_ratio_to_lru": paired_ratios(vault_cpu_times),
            "vault_cpu_us_per_put": {
                p: statistics.median(ts) / (BATCHES_PER_CALL * per_batch) * 1e6
                for p, ts in vault_cpu_times.items()
            },
        }
    finally:
        for c in clients.values():
            c.close()


def measure(
    policies: list[str],
    budget: int,
    repeats: int,
    base: Path,
    sizes: dict[str, tuple[int, int]] = SIZES,
) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for label, (blob, per_batch) in sizes.items():
        vaults = {
            p: VaultProcess(base / f"{label}-{p}", max_bytes=budget, sync="fast", extra_args=["--policy", p])
            for p in policies
        }
        try:
            for v in vaults.values():
                v.start()
            out[label] = _one_size(vaults, blob, per_batch, budget, repeats)
        finally:
            for v in vaults.values():
                v.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--budget", default="32MiB")
    ap.add_argument("--policies", default="lru,adaptive")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    policies = args.policies.split(",")
    with tempfile.TemporaryDirectory(prefix="tierkv-vault-policy-put-") as tmp:
        started = time.monotonic()
        result = measure(policies, parse_size(args.budget), args.repeats, Path(tmp))
    if args.json:
        print(
            json.dumps(
                {"args": vars(args), "seconds": time.monotonic() - started, "result": result}, indent=1
            )
        )
        return
    for label, r in result.items():
        gbs, ratio, cpu, us = (
            r[k] for k in ("gb_per_s", "ratio_to_lru", "vault_cpu_ratio_to_lru", "vault_cpu_us_per_put")
        )
        assert (
            isinstance(gbs, dict)
            and isinstance(ratio, dict)
            and isinstance(cpu, dict)
            and isinstance(us, dict)
        )
        parts = [
            f"{p} {gbs[p]:.3f} GB/s ({ratio.get(p, 1.0):.2f}x lru wall, {cpu.get(p, 1.0):.2f}x by the vault's CPU,"
            f" {us[p]:.1f} us vault CPU per Put)"
            for p in policies
        ]
        print(f"{label:6s} " + ", ".join(parts))


if __name__ == "__main__":
    main()
