"""Hot-tier protection in a real vLLM engine (CPU): what holding protected prefixes in the GPU cache buys and
what it costs.

One in-process engine with a small GPU block budget (``--blocks``, vLLM's ``num_gpu_blocks_override``)
runs TierKVConnector against a real vault process on 127.0.0.1. Protection is switched on and off between
rounds on the same engine (the protector's ``fraction``; the prefix cache is reset before every round),
alternating, so both sides see the same machine load:

- **agents**: ``--agents`` agents each have a protected system prompt (layout class ``axioms``) and send
  ``--turns`` turns (system prompt + a fresh user turn, one output token); between two turns unrelated
  long prompts (``--pressure`` of them, ``--pressure-tokens`` each) push older blocks out of the GPU
  prefix cache. Per agent turn: GPU prefix-cache hit (vLLM's ``num_cached_tokens`` minus what the
  connector restored from the vault) and TTFT (wall time of the one-token request). The first turn of
  each agent in a round is a cold start and is left out. Without protection the system prompt comes
  back from the vault; with ``--no-restore`` it is computed again instead.
- **throughput**: with the agents' blocks held (cap ``0`` = protection off), a batch of ``--batch``
  unrelated prompts of ``--batch-tokens`` tokens and ``--batch-output`` output tokens that needs more
  blocks than the pool has: output tokens per second of ``generate`` and vLLM preemptions, per cap. On a
  CPU engine the step time depends on how many sequences run at once, so a cap that changes how the
  batch is packed (7 + 1 requests or 6 + 2 with 8 requests) moves throughput either way by more than
  the held blocks themselves; the default batch of 16 keeps that effect small.

Medians per side are printed (``--json`` for machines). Run from the repository root with the vLLM
environment (scripts/setup-vllm-env.sh):

    .venv-vllm/bin/python -m benchmarks.vllm_protect [--rounds 2] [--caps 0.05,0.1,0.2] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.connectors.vllm.engine import (
    BLOCK_SIZE,
    connector_totals,
    drain,
    make_llm,
    prompt,
    scheduler_connector,
    shutdown,
    write_tiny_llama,
)
from tierkv.connectors.vllm.protect import GpuProtector
from tierkv.vault.launcher import VaultProcess

SHAPE = {"layers": 8, "hidden": 512, "heads": 8, "kv_heads": 4, "head_dim": 64}


def run_batch(
    llm: Any, prompts: list[list[int]], max_tokens: int, layout: list[dict[str, Any]] | None
) -> tuple[Any, float]:
    """Generate (greedy) for ``prompts``: the outputs and the seconds ``generate`` took. The layout, when
    given, rides in ``kv_transfer_params``. The stores of the finished requests are drained afterwards,
    outside the timing (the offline engine steps only inside ``generate``)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if layout is not None:
        params.extra_args = {"kv_transfer_params": {"tierkv": {"layout": layout}}}
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    drain(llm)
    return outs, elapsed


class Bench:
    """The engine, its protector and the trace's prompts."""

    def __init__(self, llm: Any, args: argparse.Namespace) -> None:
        self.llm = llm
        self.args = args
        conn = scheduler_connector(llm)
        self.protector: GpuProtector = conn._protect
        conn.scheduler.restores = not args.no_restore
        self.fraction = self.protector.fraction
        self.system_tokens = args.system_blocks * BLOCK_SIZE
        self.layout = [{"tokens": [0, self.system_tokens], "source": "axioms"}]
        self.preemptions = 0
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        preempt: Callable[..., Any] = sched._preempt_request

        def counted(*a: Any, **k: Any) -> Any:
            self.preemptions += 1
            return preempt(*a, **k)

        sched._preempt_request = counted
        self._seed = iter(range(10**6))

    def fresh_round(self, fraction: float) -> None:
        """Empty the GPU prefix cache (releasing every hold) and set the cap for the next round."""
        self.protector.fraction = fraction
        while not self.llm.reset_prefix_cache():
            drain(self.llm)

    def agent_turn(self, agent: int) -> tuple[int, int, float]:
        """One turn of ``agent``: (GPU prefix-cache hit tokens, tokens restored from the vault, TTFT s)."""
        tokens = prompt(100 + agent, self.system_tokens) + prompt(
            10**5 + next(self._seed), self.args.user_tokens
        )
        restored = connector_totals(self.llm)["restored_blocks"]
        (out,), ttft = run_batch(self.llm, [tokens], 1, self.layout)
        from_vault = (connector_totals(self.llm)["restored_blocks"] - restored) * BLOCK_SIZE
        return (out.num_cached_tokens or 0) - from_vault, from_vault, ttft

    def pressure(self) -> None:
        prompts = [
            prompt(10**6 + next(self._seed), self.args.pressure_tokens) for _ in range(self.args.pressure)
        ]
        for p in prompts:
            run_batch(self.llm, [p], 1, None)

    def agents_round(self, fraction: float) -> list[tuple[int, int, float]]:
        """(GPU hit, vault restore, TTFT) of every measured agent turn of one round."""
        self.fresh_round(fraction)
        turns: list[tuple[int, int, float]] = []
        for turn in range(self.args.turns + 1):
            for agent in range(self.args.agents):
                result = self.agent_turn(agent)
                if turn:  # the first turn of each agent is a cold start
                    turns.append(result)
                self.pressure()
        return turns

    def throughput_round(self, fraction: float) -> tuple[float, int, int]:
        """(output tokens/s, preemptions, blocks held when the batch started) of one batch."""
        self.fresh_round(fraction)
        for agent in range(self.args.agents):
            self.agent_turn(agent)
        held = self.protector.held
        prompts = [prompt(10**7 + next(self._seed), self.args.batch_tokens) for _ in range(self.args.batch)]
        before = self.preemptions
        _, elapsed = run_batch(self.llm, prompts, self.args.batch_output, None)
        return self.args.batch * self.args.batch_output / elapsed, self.preemptions - before, held


def agents_trace(bench: Bench, rounds: int) -> dict[str, dict[str, Any]]:
    """GPU hit rate, vault restores and median TTFT of the agents' turns, protection on and off."""
    sides: dict[str, list[tuple[int, int, float]]] = {"on": [], "off": []}
    for r in range(rounds):
        for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
            sides[side] += bench.agents_round(bench.fraction if side == "on" else 0.0)
    return {
        side: {
            "turns": len(turns),
            "gpu_hit_rate": round(sum(t[0] for t in turns) / (len(turns) * bench.system_tokens), 3),
            "vault_restore_rate": round(sum(t[1] for t in turns) / (len(turns) * bench.system_tokens), 3),
            "ttft_ms": round(statistics.median(t[2] for t in turns) * 1000, 1),
        }
        for side, turns in sides.items()
    }


def throughput(bench: Bench, rounds: int, caps: list[float]) -> list[dict[str, Any]]:
    """Output tokens/s of the batch with each cap's blocks held, against no protection (cap 0)."""
    runs: dict[float, list[tuple[float, int, int]]] = {c: [] for c in [0.0, *caps]}
    for r in range(rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for cap in order:
            runs[cap].append(bench.throughput_round(cap))
    base = statistics.median(t for t, _, _ in runs[0.0])
    return [
        {
            "cap": cap,
            "held_blocks": max(h for _, _, h in rs),
            "tokens_per_s": round(statistics.median(t for t, _, _ in rs), 1),
            "relative": round(statistics.median(t for t, _, _ in rs) / base, 3),
            "preemptions": sum(p for _, p, _ in rs),
        }
        for cap, rs in runs.items()
    ]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--blocks", type=int, default=128, help="GPU blocks of the engine (num_gpu_blocks_override)")
    add("--cap", type=float, default=0.2, help="gpu_protect_fraction of the 'on' side of the agent trace")
    add("--watermark", type=float, default=0.1, help="gpu_protect_watermark")
    add("--caps", default="0.05,0.1,0.2", help="caps whose throughput cost is measured (against 0)")
    add("--agents", type=int, default=3)
    add("--system-blocks", type=int, default=8, help="blocks of each agent's protected system prompt")
    add("--user-tokens", type=int, default=40)
    add("--turns", type=int, default=3, help="measured turns per agent and round (after a cold one)")
    add("--pressure", type=int, default=2, help="unrelated prompts between two agent turns")
    add("--pressure-tokens", type=int, default=1536)
    add("--batch", type=int, default=16)
    add("--batch-tokens", type=int, default=512)
    add("--batch-output", type=int, default=64)
    add("--rounds", type=int, default=2, help="rounds per side, alternated")
    add("--parts", default="agents,throughput", help="which measurements to run")
    add(
        "--no-restore",
        action="store_true",
        help="the connector stores but never restores: GPU cache or prefill",
    )
    add("--json", action="store_true")
    return parser.parse_args()


def main() -> None:
    args = parse()
    caps = [float(c) for c in args.caps.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        max_len = max(args.pressure_tokens, args.batch_tokens + args.batch_output, 1024) + 64
        model = write_tiny_llama(Path(tmp) / "model", **SHAPE, max_positions=max_len)
        vault = VaultProcess(Path(tmp) / "vault", max_bytes="1GiB").start()
        try:
            extra = {
                "kv_cold": vault.address,
                "gpu_protect_fraction": args.cap,
                "gpu_protect_watermark": args.watermark,
            }
            llm = make_llm(model, extra, max_model_len=max_len, num_gpu_blocks_override=args.blocks)
            try:
                bench = Bench(llm, args)
                parts = args.parts.split(",")
                result: dict[str, Any] = {
                    "agents": agents_trace(bench, args.rounds) if "agents" in parts else {},
                    "throughput": throughput(bench, args.rounds, caps) if "throughput" in parts else [],
                }
                totals = connector_totals(llm)
            finally:
                shutdown(llm)
        finally:
            vault.stop()
    report = {"blocks": args.blocks, "block_size": BLOCK_SIZE, "watermark": args.watermark, **result}
    if args.json:
        print(json.dumps({**report, "counters": totals}))
        return
    print(
        f"{args.blocks} GPU blocks of {BLOCK_SIZE} tokens, watermark {args.watermark}, {args.rounds} rounds per side"
    )
    print(
        f"agents: {args.agents} x {args.system_blocks}-block protected system prompt, cap {args.cap} on / 0 off"
    )
    for side, row in result["agents"].items():
        print(
            f"  {side:>3}: GPU hit rate {row['gpu_hit_rate']:.2f}, restored from the vault"
            f" {row['vault_restore_rate']:.2f}, median TTFT {row['ttft_ms']} ms ({row['turns']} turns)"
        )
    print(
        f"throughput: {args.batch} x {args.batch_tokens}-token prompts, {args.batch_output} output tokens each"
    )
    for row in result["throughput"]:
        print(
            f"  cap {row['cap']:<5} held {row['held_blocks']:>3}  {row['tokens_per_s']:>7} tok/s"
            f"  x{row['relative']:.3f}  preemptions {row['preemptions']}"
        )
    keys = (
        "gpu_protect_holds",
        "gpu_protect_releases",
        "gpu_protect_pressure_releases",
        "gpu_protect_skipped",
    )
    print("counters: " + ", ".join(f"{k} {totals[k]}" for k in keys))


if __name__ == "__main__":
    main()
