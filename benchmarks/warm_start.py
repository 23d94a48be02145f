"""First-request TTFT of the hottest prefixes after a vLLM restart (CPU): warm (``tierkv warm``) vs cold.

Setup: one vault process on 127.0.0.1 and a tiny llama with random weights. A first vLLM OpenAI server
(TierKVConnector, ``[retention] warm_tokens = true``) serves ``--prefixes`` prompts of ``--tokens`` tokens
twice (the second time from the vault, so the chains have hits) and is stopped; ``tierkv snapshot`` is
taken. Then, for ``--rounds`` rounds, alternating which goes first, a fresh server is started:

- ``cold``: the hottest prefixes' first requests come as traffic would (the connector restores them from
  the vault on first use);
- ``warm``: :func:`tierkv.warm.replay` (what ``tierkv warm`` runs) replays the snapshot first, then the
  same first requests come (they hit vLLM's own GPU prefix cache).

Every server first serves one unrelated short request (first-call kernels), in both modes. A first
request is each prefix plus 3 new tokens, one output token; TTFT is its wall time over HTTP. Medians over
every round and prefix are printed, with the warm replay's own time. Run from the repository root with
the vLLM environment:

    .venv-vllm/bin/python -m benchmarks.warm_start [--model small|medium] [--rounds 3] [--prefixes 4]
        [--tokens 960] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.vllm_restore_ttft import MODELS
from tests.connectors.vllm.engine import prompt, write_tiny_llama
from tests.connectors.vllm.test_server_vllm import MODEL, metric, post, serve, stored
from tierkv.config import load_config
from tierkv.vault.launcher import VaultProcess
from tierkv.warm import Prefix, replay, take_snapshot


def complete(base: str, tokens: list[int]) -> float:
    """Wall time of a one-output-token completion of ``tokens``."""
    start = time.perf_counter()
    post(f"{base}/v1/completions", {"model": MODEL, "prompt": tokens, "max_tokens": 1, "temperature": 0.0})
    return time.perf_counter() - start


def first_requests(base: str, prompts: list[list[int]]) -> tuple[list[float], float]:
    """TTFT of each prompt's first request (plus 3 new tokens) and blocks the vault gave for them."""
    before = metric(base, "restored_blocks")
    times = [complete(base, [*p, 5, 6, 7]) for p in prompts]
    return times, metric(base, "restored_blocks") - before


def one_round(model: Path, toml: Path, logs: Path, mode: str, top: list[Prefix]) -> dict[str, Any]:
    with serve(model, toml, logs / f"{mode}-{time.monotonic_ns()}.log") as base:
        complete(base, prompt(999, 40))  # first-call kernels, in both modes
        replayed = 0.0
        if mode == "warm":
            done = replay(top, base, model=MODEL)
            assert all(r.ok for r in done), [r.error for r in done]
            replayed = sum(r.seconds for r in done)
        times, from_vault = first_requests(base, [list(p.tokens) for p in top])
    return {"mode": mode, "ttft_s": times, "replay_s": replayed, "vault_blocks": from_vault}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="medium")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefixes", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=960)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = write_tiny_llama(root / "model", **MODELS[args.model])
        vault = VaultProcess(root / "vault", max_bytes="2GiB").start()
        try:
            toml = root / "tierkv.toml"
            host, port = vault.address.rsplit(":", 1)
            toml.write_text(
                f'[cluster]\ntimeout = 10.0\nkv_cold = {{host = "{host}", port = {port}}}\n'
                "[retention]\nwarm_tokens = true\n"
            )
            prompts = [prompt(100 + i, args.tokens) for i in range(args.prefixes)]
            with serve(model, toml, root / "seed.log") as base:
                for _ in range(2):
                    for p in prompts:
                        complete(base, p)
                    stored(base)
            snap = take_snapshot(load_config(str(toml)), limit=args.prefixes)
            top = [p for p in snap.prefixes if p.hits > 0][: args.prefixes]
            rounds = []
            for r in range(args.rounds):
                for mode in ("cold", "warm") if r % 2 == 0 else ("warm", "cold"):
                    rounds.append(one_round(model, toml, root, mode, top))
        finally:
            vault.stop()
    report(args, top, rounds)


def report(args: argparse.Namespace, top: list[Prefix], rounds: list[dict[str, Any]]) -> None:
    med = {
        mode: statistics.median(t for r in rounds if r["mode"] == mode for t in r["ttft_s"])
        for mode in ("cold", "warm")
    }
    replay_s = statistics.median(r["replay_s"] for r in rounds if r["mode"] == "warm")
    vault_blocks = {mode: sum(r["vault_blocks"] for r in rounds if r["mode"] == mode) for mode in med}
    if args.json:
        doc = {"model": args.model, "prefixes": len(top), "tokens": [len(p.tokens) for p in top]}
        print(json.dumps({**doc, "median_ttft_s": med, "median_replay_s": replay_s, "rounds": rounds}))
        return
    print(
        f"model {args.model}, {len(top)} prefixes of {[len(p.tokens) for p in top]} tokens, {args.rounds} rounds"
    )
    print(
        f"first-request TTFT after a restart, median: cold {med['cold'] * 1000:.1f} ms, warm {med['warm'] * 1000:.1f} ms"
        f" ({med['cold'] / med['warm']:.2f}x)"
    )
    print(f"warm replay of the snapshot (median total): {replay_s * 1000:.0f} ms")
    print(
        f"blocks loaded from the vault by the first requests: cold {vault_blocks['cold']:.0f}, warm {vault_blocks['warm']:.0f}"
    )


if __name__ == "__main__":
    main()
