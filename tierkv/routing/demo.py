"""``tierkv demo --cluster``: two CPU vLLM replicas with TierKVConnector, two vaults and vllm-router
``kv_aware`` on loopback, an agent trace through the router, and where each request went and why.

The model is a tiny random Llama (``--load-format dummy``: no download, meaningless text) with a word
tokenizer, so the demo runs on any machine with the vLLM environment (scripts/setup-vllm-env.sh). The
"why" is the router's own decision log: how many prompt tokens it credited on the chosen replica.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tierkv.routing.cluster import LocalCluster, complete, connector_total, reset_prefix_cache, routed

MODEL = "tiny-agents"
VOCAB = 1000
DECISION = re.compile(
    r'KV prefix decision outcome="(?P<outcome>[^"]+)" worker="(?P<worker>[^"]+)".*?'
    r"input_tokens=(?P<input>\d+) new_prefill_tokens=(?P<new>\d+) "
    r"credited_prefix_tokens=(?P<credited>\d+)"
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def write_tiny_model(path: Path) -> Path:
    """A 2-layer Llama config and a word tokenizer (``t0`` … ``t999``); weights come from
    ``--load-format dummy``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (path / "config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    meta = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0", "eos_token": "t2"}
    (path / "tokenizer_config.json").write_text(json.dumps(meta))
    return path


def words(seed: int, n: int) -> str:
    """``n`` deterministic pseudo-random words of the tiny tokenizer."""
    return " ".join(f"t{(seed * 7919 + i * 104729 + (i * i) % 97) % (VOCAB - 3) + 3}" for i in range(n))


@dataclasses.dataclass(frozen=True)
class Turn:
    agent: str
    conversation: int
    turn: int
    prompt: str


def agent_trace(
    agents: int = 2, conversations: int = 2, turns: int = 2, system_words: int = 160
) -> Iterator[Turn]:
    """Agents with a shared system prompt each; multi-turn conversations that grow by a user message
    and the previous answer's stand-in, interleaved across agents as a scheduler would see them."""
    systems = {f"agent{a}": words(100 + a, system_words) for a in range(agents)}
    index = {name: a for a, name in enumerate(systems)}
    history = {(name, c): "" for name in systems for c in range(conversations)}
    for turn in range(turns):
        for c in range(conversations):
            for name, system in systems.items():
                user = words(1000 * (c + 1) + 10 * turn + index[name], 24)
                history[name, c] = f"{history[name, c]} {user}".strip()
                yield Turn(name, c, turn, f"{system} {history[name, c]}")


@dataclasses.dataclass(frozen=True)
class Routed:
    """One request: the replica the router chose, the prompt tokens it credited there (cached on that
    replica's GPU, or announced in the vaults), the tokens left to prefill by the router's estimate, and
    the prompt tokens the chosen replica then loaded from the vaults."""

    turn: Turn
    replica: str
    credited: int
    prefill: int
    outcome: str
    restored: int = 0

    def why(self) -> str:
        if self.restored:
            return f"restored {self.restored} prompt tokens from the vaults"
        if self.credited:
            return f"{self.credited} prompt tokens already cached there"
        return "no cached prefix anywhere: the least loaded replica"


def decisions(log: Path, skip: int) -> list[dict[str, str]]:
    """The router's kv_aware decisions logged after the first ``skip`` ones."""
    text = ANSI.sub("", log.read_text(errors="replace"))
    return [m.groupdict() for m in DECISION.finditer(text)][skip:]


def _restored(cluster: LocalCluster) -> int:
    """Prompt tokens the vaults served so far, every replica's connector together."""
    return int(sum(connector_total(spec.url, "restore_tokens") for spec, _ in cluster.replicas))


def send_trace(
    cluster: LocalCluster,
    trace: Iterable[Turn],
    max_tokens: int = 4,
    on_each: Callable[[Routed], None] | None = None,
) -> list[Routed]:
    """Each turn through the router, in order; which replica served it, the router's reason and the tokens
    restored from the vaults. ``on_each`` sees each result as it arrives (progress)."""
    assert cluster.router is not None
    router, process = cluster.router
    names = {spec.url: f"replica{i}" for i, (spec, _) in enumerate(cluster.replicas)}
    results = []
    for turn in trace:
        seen = len(decisions(process.log, 0))
        before, restored_before = routed(router), _restored(cluster)
        complete(router.url, cluster.served_name, turn.prompt, max_tokens)
        after = routed(router)
        chosen = [w for w in after if after[w] != before.get(w, 0)]
        why = decisions(process.log, seen)
        last = why[-1] if why else {"credited": "0", "new": "0", "outcome": "?"}
        replica = names.get(chosen[0], chosen[0]) if chosen else "?"
        restored = _restored(cluster) - restored_before
        result = Routed(turn, replica, int(last["credited"]), int(last["new"]), last["outcome"], restored)
        results.append(result)
        if on_each is not None:
            on_each(result)
    return results


def progress_line(console: Console, label: str) -> Callable[[Routed], None]:
    """A printer of one line per request, as it is served."""
    count = 0

    def show(r: Routed) -> None:
        nonlocal count
        count += 1
        console.print(
            f"{label} {count}: {r.turn.agent} conversation {r.turn.conversation} turn {r.turn.turn} "
            f"-> {r.replica}: {r.why()}",
            highlight=False,
        )

    return show


def report(results: list[Routed], console: Console, title: str) -> None:
    table = Table(title=title)
    for column in ("#", "agent", "conv", "turn", "replica", "credited", "prefill", "restored", "why"):
        table.add_column(column)
    for i, r in enumerate(results):
        cells = (r.turn.agent, r.turn.conversation, r.turn.turn, r.replica, r.credited, r.prefill, r.restored)
        table.add_row(str(i), *(str(c) for c in cells), r.why())
    console.print(table)


def verdict(trace: list[Routed], again: list[Routed]) -> str:
    """One line: what tierkv added in this run, or what it did not."""
    restored = sum(r.restored for r in again)
    credited = sum(1 for r in trace if r.credited)
    replicas = sorted({r.replica for r in trace})
    where = (
        f"the router sent {credited} of {len(trace)} requests where their prefix was cached "
        f"(replicas used: {', '.join(replicas)})"
    )
    if restored:
        hit = sum(1 for r in again if r.restored)
        return (
            f"verdict: tierkv restored {restored} prompt tokens from the vaults for {hit} of {len(again)} "
            f"requests after the replicas dropped their caches; {where}"
        )
    return f"verdict: nothing came back from the vaults (see the replicas' logs); {where}"


def run_cluster_demo(state_dir: Path, console: Console) -> list[Routed]:
    """Start everything, send the trace, drop the replicas' caches and send each agent's first turn
    again, print what happened and a verdict, stop everything (by PID)."""
    if state_dir.exists():
        shutil.rmtree(state_dir)
    model = write_tiny_model(state_dir / "model")
    args = ("--dtype", "float32", "--enforce-eager", "--load-format", "dummy")
    console.rule("[bold]starting 2 vaults, 2 vLLM replicas (CPU) and vllm-router kv_aware")
    cluster = LocalCluster(
        state_dir / "cluster",
        str(model),
        served_name=MODEL,
        replica_args=args,
        router_args=("--log-level", "debug"),
    )
    with console.status("starting (a CPU takes a minute or two per replica) ..."):
        cluster.start()
    try:
        for i, (spec, _) in enumerate(cluster.replicas):
            console.print(f"replica{i}: {spec.url}  events {spec.events}")
        router = cluster.router[0].url if cluster.router else "-"
        console.print(f"vaults: {', '.join(v.address for v in cluster.vaults)}; router: {router}")
        console.rule("[bold]1. an agent trace through the router")
        trace = send_trace(cluster, agent_trace(), on_each=progress_line(console, "request"))
        console.rule("[bold]2. the replicas drop their prefix caches (as under memory pressure)")
        for spec, _ in cluster.replicas:
            reset_prefix_cache(spec.url)
        first_turns = [t for t in agent_trace() if t.turn == 0 and t.conversation == 0]
        again = send_trace(cluster, first_turns, on_each=progress_line(console, "again"))
        report(trace + again, console, "where each request went, and why")
        console.print(verdict(trace, again), highlight=False)
    finally:
        cluster.stop()
    return trace + again
