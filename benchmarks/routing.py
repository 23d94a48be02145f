"""Routing across two CPU vLLM replicas: round_robin, cache_aware and kv_aware (vllm-router 0.1.17), each
with and without TierKVConnector, and kv_aware with the connector's cold-tier events.

Each contender is a fresh local cluster (two replicas of a tiny seeded random-weight Llama, GPU caches of
``--gpu-blocks`` blocks so the trace evicts, two vaults when the connector runs) that serves the same agent
trace through the router: ``--agents`` shared system prompts, ``--conversations`` each, ``--turns``
multi-turn steps (each prompt = system prompt + the conversation so far), one output token per request.
Contenders are interleaved over ``--rounds`` (every round runs each once, in a rotated order).

Reported per contender (medians over rounds): GPU prefix hit rate (vLLM's prefix_cache_hits/queries,
both replicas), tokens restored from the vaults (vLLM's external_kv_transfer prompt tokens), tokens
prefilled (local_compute prompt tokens), mean and p90 time to first token (client wall time of a
one-token request through the router). Requests are sequential: this machine class has two CPU cores
shared by both replicas, the router and the client, so figures show the routing effect, not a load test.

    .venv-vllm/bin/python -m benchmarks.routing [--model medium] [--rounds 2] [--load-mode sync] [--only NAME,NAME] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.vllm_restore_ttft import MODELS
from tests.connectors.vllm.engine import write_tiny_llama
from tierkv.routing.cluster import LocalCluster, complete, scrape
from tierkv.routing.demo import agent_trace

MODEL = "tiny"


@dataclass(frozen=True)
class Contender:
    name: str
    policy: str
    connector: bool
    cold_events: bool = False


CONTENDERS = (
    Contender("round_robin", "round_robin", False),
    Contender("round_robin + tierkv", "round_robin", True),
    Contender("cache_aware", "cache_aware", False),
    Contender("cache_aware + tierkv", "cache_aware", True),
    Contender("kv_aware", "kv_aware", False),
    Contender("kv_aware + tierkv", "kv_aware", True),
    Contender("kv_aware + tierkv cold events", "kv_aware", True, True),
)


def totals(cluster: LocalCluster) -> dict[str, float]:
    """The vLLM counters this benchmark reads, summed over the replicas."""
    sums = dict.fromkeys(("queries", "hits", "restored", "prefilled"), 0.0)
    for spec, _ in cluster.replicas:
        for name, value in scrape(f"{spec.url}/metrics").items():
            base = name.split("{", 1)[0]
            if base == "vllm:prefix_cache_queries_total":
                sums["queries"] += value
            elif base == "vllm:prefix_cache_hits_total":
                sums["hits"] += value
            elif base == "vllm:prompt_tokens_by_source_total" and 'source="external_kv_transfer"' in name:
                sums["restored"] += value
            elif base == "vllm:prompt_tokens_by_source_total" and 'source="local_compute"' in name:
                sums["prefilled"] += value
    return sums


def run_one(contender: Contender, model: Path, root: Path, args: argparse.Namespace) -> dict[str, float]:
    replica_args = (
        "--dtype",
        "float32",
        "--enforce-eager",
        "--num-gpu-blocks-override",
        str(args.gpu_blocks),
    )
    cluster = LocalCluster(
        root,
        str(model),
        served_name=MODEL,
        connector=contender.connector,
        cold_events=contender.cold_events,
        policy=contender.policy,
        replica_args=replica_args,
        vaults=2,
        connector_extra={"load_mode": args.load_mode},
    )
    with cluster:
        assert cluster.router is not None
        router = cluster.router[0].url
        before = totals(cluster)
        ttft = []
        for turn in agent_trace(args.agents, args.conversations, args.turns, args.system_words):
            start = time.perf_counter()
            complete(router, MODEL, turn.prompt, max_tokens=1)
            ttft.append(time.perf_counter() - start)
        time.sleep(1.0)  # the last stats interval
        complete(router, MODEL, "t5 t6", max_tokens=1)
        after = totals(cluster)
    moved = {k: after[k] - before[k] for k in after}
    ttft.sort()
    return {
        "gpu_hit_rate": moved["hits"] / moved["queries"] if moved["queries"] else 0.0,
        "tokens_restored": moved["restored"],
        "tokens_prefilled": moved["prefilled"],
        "ttft_mean_ms": 1000 * statistics.fmean(ttft),
        "ttft_p90_ms": 1000 * ttft[min(len(ttft) - 1, int(0.9 * len(ttft)))],
        "requests": float(len(ttft)),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--model", choices=sorted(MODELS), default="small", help="random Llama size (medium: 8 layers)"
    )
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--system-words", type=int, default=320)
    parser.add_argument("--gpu-blocks", type=int, default=40)
    parser.add_argument("--load-mode", choices=("async", "sync"), default="async", help="the connector's")
    parser.add_argument("--only", default="", help="comma-separated contender names (default: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    chosen = [c for c in CONTENDERS if not args.only or c.name in args.only.split(",")]
    results: dict[str, list[dict[str, float]]] = {c.name: [] for c in chosen}
    with tempfile.TemporaryDirectory(prefix="tierkv-routing-") as tmp:
        root = Path(tmp)
        model = write_tiny_llama(root / "model", **MODELS[args.model])
        for r in range(args.rounds):
            order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]
            for i, contender in enumerate(order):
                got = run_one(contender, model, root / f"r{r}-{i}", args)
                results[contender.name].append(got)
                if not args.json:
                    print(
                        f"round {r} {contender.name}: {json.dumps({k: round(v, 3) for k, v in got.items()})}"
                    )
    summary = {
        name: {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        for name, runs in results.items()
    }
    if args.json:
        print(json.dumps({"args": vars(args), "median": summary, "runs": results}, indent=2))
        return
    print(
        f"\n{'contender':<32} {'GPU hit':>8} {'restored':>9} {'prefilled':>10} {'TTFT mean':>10} {'p90':>8}"
    )
    for name, m in summary.items():
        print(
            f"{name:<32} {m['gpu_hit_rate']:>8.1%} {m['tokens_restored']:>9.0f} {m['tokens_prefilled']:>10.0f}"
            f" {m['ttft_mean_ms']:>8.1f}ms {m['ttft_p90_ms']:>6.1f}ms"
        )


if __name__ == "__main__":
    main()
