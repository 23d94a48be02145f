"""``tierkv demo``: the whole loop on one machine, with nothing but embedded defaults.

Starts a ``kv_cold`` and an ``ssm_cold`` vault on loopback (LMDB under ``.state/demo``), asks them for their
status over RPC, stores the KV of a 4k-token prompt shaped like Qwen2.5-0.5B (plus hybrid-model SSM
snapshots) through the cluster client, restores it the way an engine would (one prefix lookup, one
BatchGet per vault, every blob verified and decoded), shows a second prompt that shares half the prefix,
and stops the vaults with SIGTERM.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from tierkv.bench.shapes import SHAPES
from tierkv.client.cluster import Cluster
from tierkv.codec import LayerGroup, decode, encode
from tierkv.config import Config, human_bytes, load_config, to_toml
from tierkv.keys import Namespace, block_keys
from tierkv.roles import Role, role_for
from tierkv.status import cluster_status, status_table
from tierkv.vault.launcher import VaultProcess


@dataclasses.dataclass
class DemoResult:
    blocks: int
    kv_bytes: int
    ssm_bytes: int
    store_s: float
    lookup_s: float
    restore_s: float
    restored_blocks: int
    verified: bool
    shared_prefix_blocks: int
    exit_codes: list[int]

    @property
    def ok(self) -> bool:
        return self.verified and self.restored_blocks == self.blocks and all(c == 0 for c in self.exit_codes)


def run_demo(state_dir: Path, console: Console, *, tokens: int = 4096, block_tokens: int = 16) -> DemoResult:
    """Run the demo; ValueError when ``tokens`` is shorter than one block (nothing to store)."""
    if tokens < block_tokens:
        raise ValueError(f"--tokens must be at least one block ({block_tokens} tokens), got {tokens}")
    shape = SHAPES["qwen2.5-0.5b"]
    if state_dir.exists():
        shutil.rmtree(state_dir)
    state_dir.mkdir(parents=True)
    console.rule("[bold]1. start two vaults on loopback")
    vaults = {
        Role.KV_COLD: VaultProcess(state_dir / "kv_cold", role=Role.KV_COLD, max_bytes="1GiB"),
        Role.SSM_COLD: VaultProcess(state_dir / "ssm_cold", role=Role.SSM_COLD, max_bytes="1GiB"),
    }
    exit_codes: list[int] = []
    try:
        for role, vp in vaults.items():
            vp.start()
            console.print(f"  {role:9} tierkv vault on {vp.address}  (LMDB in {vp.path})")
        cluster = {str(role): {"host": "127.0.0.1", "port": v.port} for role, v in vaults.items()}
        config_file = state_dir / "tierkv.toml"
        config_file.write_text(to_toml({"cluster": cluster}))
        cfg = load_config(config_file)
        console.rule("[bold]2. tierkv status (over RPC)")
        console.print(status_table(cluster_status(cfg), f"tierkv status ({cfg.source})"))
        result = _workload(cfg, console, shape_name=shape.name, tokens=tokens, block_tokens=block_tokens)
        console.rule("[bold]5. status after the workload")
        console.print(status_table(cluster_status(cfg), "tierkv status"))
    finally:
        console.rule("[bold]6. stop the vaults (SIGTERM)")
        for role, vp in vaults.items():
            code = vp.stop()
            exit_codes.append(code)
            console.print(f"  {role:9} exited with {code}")
    result.exit_codes = exit_codes
    verdict = "[green]PASS[/green]" if result.ok else "[red]FAIL[/red]"
    console.print(
        f"\n{verdict}: stored {result.blocks} KV blocks ({human_bytes(result.kv_bytes)}) and "
        f"{human_bytes(result.ssm_bytes)} of SSM state, restored {result.restored_blocks} blocks bit-exact "
        f"in {result.restore_s * 1000:.0f} ms ({result.kv_bytes / result.restore_s / 1e9:.2f} GB/s)."
    )
    return result


def _workload(
    cfg: Config, console: Console, *, shape_name: str, tokens: int, block_tokens: int
) -> DemoResult:
    shape = SHAPES[shape_name]
    rng = np.random.default_rng(0)
    ns = Namespace(model=f"demo/{shape.name}", dtype=shape.dtype, codec="raw", layout="demo-v1")
    prompt = rng.integers(0, 150_000, size=tokens)
    keys = block_keys(prompt, block_tokens, namespace=ns)
    blocks = [shape.random_block(block_tokens, rng) for _ in keys]
    blobs = {
        k: encode(b, codec="raw", tokens=block_tokens, dtype=shape.dtype, layer_group=LayerGroup.ATTENTION)
        for k, b in zip(keys, blocks, strict=True)
    }
    hybrid = SHAPES["qwen3.6-35b-a3b"]
    ssm_keys = keys[-1:]
    ssm_blobs = {
        k: encode(hybrid.random_ssm_state(rng), codec="raw", tokens=tokens, layer_group=LayerGroup.SSM)
        for k in ssm_keys
    }
    kv_bytes = sum(len(b) for b in blobs.values())
    ssm_bytes = sum(len(b) for b in ssm_blobs.values())
    console.rule(f"[bold]3. store a {tokens}-token prompt shaped like {shape.name}")
    with Cluster.from_config(cfg, timeout=30.0) as cluster:
        start = time.perf_counter()
        stored = cluster.put(ns.digest, blobs, role=Role.KV_COLD).stored
        stored_ssm = cluster.put(ns.digest, ssm_blobs, role=role_for(LayerGroup.SSM)).stored
        store_s = time.perf_counter() - start
        console.print(
            f"  {stored} KV blocks of {len(next(iter(blobs.values()))):,} bytes → kv_cold, "
            f"{stored_ssm} SSM snapshot of {human_bytes(ssm_bytes)} → ssm_cold "
            f"in {store_s * 1000:.0f} ms ({(kv_bytes + ssm_bytes) / store_s / 1e9:.2f} GB/s, durable)"
        )
        console.rule("[bold]4. the prefix returns: restore instead of prefill")
        start = time.perf_counter()
        n_present = cluster.prefix_lookup(ns.digest, keys, role=Role.KV_COLD)
        lookup_s = time.perf_counter() - start
        timings = []
        for _ in range(2):  # the first one also opens the bulk connection
            start = time.perf_counter()
            fetched = cluster.get_buffers(ns.digest, keys[:n_present], role=Role.KV_COLD)
            restored = [decode(b)[1] if b is not None else None for b in fetched]
            timings.append(time.perf_counter() - start)
        first_s, restore_s = timings
        verified = all(
            r is not None and np.array_equal(r, b) for r, b in zip(restored, blocks[:n_present], strict=True)
        )
        ssm_ok = cluster.get(ns.digest, ssm_keys, role=Role.SSM_COLD) == list(ssm_blobs.values())
        other = np.concatenate([prompt[: tokens // 2], rng.integers(0, 150_000, size=tokens // 2)])
        shared = cluster.prefix_lookup(
            ns.digest, block_keys(other, block_tokens, namespace=ns), role=Role.KV_COLD
        )
    table = Table(show_header=True)
    for col in ("what", "value"):
        table.add_column(col)
    table.add_row("prefix lookup", f"{n_present}/{len(keys)} blocks present, {lookup_s * 1000:.1f} ms")
    table.add_row(
        "BatchGet + verify + decode",
        f"{restore_s * 1000:.1f} ms for {human_bytes(kv_bytes)} "
        f"(first time, connecting: {first_s * 1000:.1f} ms)",
    )
    table.add_row("restore throughput", f"{kv_bytes / restore_s / 1e9:.2f} GB/s")
    table.add_row("bit-exact", "yes" if verified and ssm_ok else "[red]NO[/red]")
    table.add_row(
        "bytes per token", f"{shape.kv_bytes_per_token:,} (KV) — {human_bytes(kv_bytes)} per {tokens} tokens"
    )
    table.add_row("second prompt sharing half", f"{shared} of {len(keys)} blocks reusable")
    console.print(table)
    return DemoResult(
        blocks=len(keys),
        kv_bytes=kv_bytes,
        ssm_bytes=ssm_bytes,
        store_s=store_s,
        lookup_s=lookup_s,
        restore_s=restore_s,
        restored_blocks=n_present,
        verified=verified and ssm_ok,
        shared_prefix_blocks=shared,
        exit_codes=[],
    )
