"""Store on finish vs store on eviction in a real vLLM engine (CPU): what each ships and what it restores.

One in-process engine with a small GPU block budget (``--blocks``, vLLM's ``num_gpu_blocks_override``)
runs TierKVConnector (``store: "eviction"``) against a real vault process on 127.0.0.1. Rounds alternate
between the two modes on the same engine (a finish round detaches the connector's eviction walk, so the
connector ships every finished request as ``store: "finish"`` does), so both see the same machine load.
Every round uses prompts of its own (nothing it asks is in the vault yet) and starts with an empty
prefix cache. A round:

1. ``--cold`` prefixes of ``--prefix-tokens`` tokens are asked once;
2. ``--hot`` prefixes are asked ``--turns`` times each, interleaved, with a fresh ``--tail-tokens`` tail
   per turn: they come back while still in the GPU prefix cache;
3. ``--pressure`` unrelated prompts of ``--pressure-tokens`` tokens push older blocks out of the pool;
4. the cold prefixes are asked again (with a fresh tail): they come back after eviction.

Every request generates ``--output`` tokens. Per mode (sums over its rounds): bytes and blobs shipped to
the vault per served token (prompt + output tokens of every request), and the restore hit rate: of the
prefix tokens a returning request could reuse that the GPU prefix cache no longer had, the fraction the
vault supplied. Run from the repository root with the vLLM environment (scripts/setup-vllm-env.sh):

    .venv-vllm/bin/python -m benchmarks.vllm_store_modes [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.connectors.vllm.engine import (
    BLOCK_SIZE,
    connector_totals,
    delta,
    drain,
    make_llm,
    prompt,
    scheduler_connector,
    shutdown,
    write_tiny_llama,
)
from tierkv.vault.launcher import VaultProcess

MODES = ("finish", "eviction")


@dataclass
class Tally:
    """What one mode served, shipped and restored."""

    served_tokens: int = 0
    shipped_bytes: int = 0
    vault_writes: int = 0
    reusable_tokens: int = 0
    gpu_hit_tokens: int = 0
    restored_tokens: int = 0

    def add(self, other: Tally) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def summary(self) -> dict[str, float]:
        missed = self.reusable_tokens - self.gpu_hit_tokens
        return {
            **asdict(self),
            "bytes_per_served_token": self.shipped_bytes / max(self.served_tokens, 1),
            "writes_per_1k_served_tokens": 1000 * self.vault_writes / max(self.served_tokens, 1),
            "restore_hit_rate": self.restored_tokens / missed if missed > 0 else float("nan"),
        }


class Bench:
    def __init__(self, llm: Any, args: argparse.Namespace) -> None:
        from vllm import SamplingParams

        self.llm = llm
        self.args = args
        self.params = SamplingParams(max_tokens=args.output, temperature=0.0, ignore_eos=True)
        self.walk = scheduler_connector(llm).scheduler.eviction

    def ask(self, tokens: list[int], reusable: int, tally: Tally) -> None:
        """One request; ``reusable`` leading tokens were asked before in this round."""
        from vllm.inputs import TokensPrompt

        before = connector_totals(self.llm)
        (out,) = self.llm.generate([TokensPrompt(prompt_token_ids=tokens)], self.params, use_tqdm=False)
        restored = delta(before, connector_totals(self.llm)).get("restored_blocks", 0) * BLOCK_SIZE
        tally.served_tokens += len(tokens) + len(out.outputs[0].token_ids)
        if reusable:
            usable = (min(reusable, len(tokens) - 1) // BLOCK_SIZE) * BLOCK_SIZE
            tally.reusable_tokens += usable
            tally.restored_tokens += restored
            tally.gpu_hit_tokens += min(max((out.num_cached_tokens or 0) - restored, 0), usable)

    def round(self, mode: str, seed: int) -> Tally:
        a, llm = self.args, self.llm
        drain(llm)
        assert llm.reset_prefix_cache()
        scheduler_connector(llm).scheduler.eviction = self.walk if mode == "eviction" else None
        tally = Tally()
        before = connector_totals(llm)
        cold = [prompt(seed + i, a.prefix_tokens) for i in range(a.cold)]
        hot = [prompt(seed + 100 + i, a.prefix_tokens) for i in range(a.hot)]
        for c in cold:
            self.ask(c + prompt(seed + 200, a.tail_tokens), 0, tally)
        for turn in range(a.turns):
            for i, h in enumerate(hot):
                self.ask(h + prompt(seed + 300 + 10 * i + turn, a.tail_tokens), len(h) if turn else 0, tally)
        for i in range(a.pressure):
            self.ask(prompt(seed + 500 + i, a.pressure_tokens), 0, tally)
        for i, c in enumerate(cold):
            self.ask(c + prompt(seed + 600 + i, a.tail_tokens), len(c), tally)
        drain(llm)
        moved = delta(before, connector_totals(llm))
        tally.shipped_bytes = moved.get("stored_bytes", 0)
        tally.vault_writes = moved.get("stored_blocks", 0)
        return tally


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--rounds", type=int, default=2, help="rounds per mode, alternating")
    add("--blocks", type=int, default=160, help="GPU blocks (num_gpu_blocks_override)")
    add("--batched-tokens", type=int, default=128, help="max_num_batched_tokens (tokens per step)")
    add("--lookahead", type=int, default=0, help="evict_lookahead (0: the connector's default)")
    add("--hot", type=int, default=4)
    add("--turns", type=int, default=8)
    add("--cold", type=int, default=3)
    add("--prefix-tokens", type=int, default=256)
    add("--tail-tokens", type=int, default=40)
    add("--pressure", type=int, default=6)
    add("--pressure-tokens", type=int, default=480)
    add("--output", type=int, default=8)
    add("--json", action="store_true")
    return parser.parse_args()


def main() -> None:
    args = parse()
    tallies = {m: Tally() for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        max_len = max(args.prefix_tokens + args.tail_tokens, args.pressure_tokens) + args.output + 64
        model = write_tiny_llama(Path(tmp) / "model", max_positions=max(max_len, 1024))
        vault = VaultProcess(Path(tmp) / "vault", max_bytes="1GiB").start()
        try:
            extra = {
                "kv_cold": vault.address,
                "store": "eviction",
                "evict_lookahead": args.lookahead,
                "gpu_protect_fraction": 0.0,
            }
            llm = make_llm(
                model,
                extra,
                max_model_len=max_len,
                num_gpu_blocks_override=args.blocks,
                max_num_batched_tokens=args.batched_tokens,
            )
            try:
                bench = Bench(llm, args)
                for r in range(args.rounds):
                    for k, mode in enumerate(MODES if r % 2 == 0 else reversed(MODES)):
                        tallies[mode].add(bench.round(mode, seed=10_000 * (2 * r + k + 1)))
                lookahead = bench.walk.lookahead if bench.walk is not None else 0
            finally:
                shutdown(llm)
        finally:
            vault.stop()
    report = {
        "blocks": args.blocks,
        "block_size": BLOCK_SIZE,
        "lookahead": lookahead,
        "rounds": args.rounds,
        **{m: t.summary() for m, t in tallies.items()},
    }
    if args.json:
        print(json.dumps(report))
        return
    print(
        f"GPU blocks {args.blocks} x {BLOCK_SIZE} tokens, lookahead {lookahead}, {args.rounds} round(s)/mode"
    )
    print(
        f"{'mode':<9} {'served tok':>10} {'shipped MB':>10} {'B/tok':>8} {'writes/1k tok':>13} {'restore hit':>11}"
    )
    for mode in MODES:
        s = report[mode]
        print(
            f"{mode:<9} {s['served_tokens']:>10} {s['shipped_bytes'] / 1e6:>10.2f} "
            f"{s['bytes_per_served_token']:>8.0f} {s['writes_per_1k_served_tokens']:>13.1f} "
            f"{s['restore_hit_rate']:>11.2f}"
        )


if __name__ == "__main__":
    main()
