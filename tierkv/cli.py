"""The ``tierkv`` command: thin — parse flags, call the library, render with rich."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console

from tierkv import __version__
from tierkv.config import Config, load_config, with_overrides
from tierkv.errors import ConfigError, TierKVError
from tierkv.logs import setup_logging

app = typer.Typer(
    name="tierkv",
    help="KV-cache tiering for LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# rich assumes 80 columns when output is piped; tables of figures read better unwrapped
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

ConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        "-c",
        help="tierkv.toml (default: $TIERKV_CONFIG, ./tierkv.toml, ~/.config/tierkv/tierkv.toml)",
    ),
]
Verbose = Annotated[int, typer.Option("--verbose", "-v", count=True, help="More log output (-vv for debug).")]


def _load(path: str | None) -> Config:
    try:
        return load_config(path)
    except ConfigError as exc:
        err.print(f"[red]config error:[/red] {exc}")
        raise typer.Exit(2) from exc


def _version(value: bool) -> None:
    if value:
        out.print(f"tierkv {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """tierkv keeps KV cache that a GPU would throw away, on vault daemons, and brings it back."""


@app.command()
def vault(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="gRPC port (default 50051; 0 picks a free one).")] = None,
    path: Annotated[str | None, typer.Option(help="LMDB directory (default: user data dir).")] = None,
    max_bytes: Annotated[str | None, typer.Option(help="Byte budget, e.g. 8GiB.")] = None,
    sync: Annotated[str | None, typer.Option(help="durable (fsync per batch) or fast.")] = None,
    policy: Annotated[str | None, typer.Option(help="Eviction policy: lru or priority-lru.")] = None,
    role: Annotated[str | None, typer.Option(help="Role this vault serves: kv_cold or ssm_cold.")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Prometheus /metrics port (0 = off).")] = None,
    ready_file: Annotated[str | None, typer.Option(help="Write the bound port here once serving.")] = None,
    verbose: Verbose = 0,
) -> None:
    """Run one vault in the foreground until SIGTERM or SIGINT."""
    from tierkv.vault.server import PortInUseError, VaultServer

    cfg = _load(config)
    try:
        size = None if max_bytes is None else max_bytes
        cfg = with_overrides(
            cfg,
            "vault",
            host=host,
            port=port,
            path=path,
            max_bytes=size,
            sync=sync,
            policy=policy,
            metrics_port=metrics_port,
        )
        if role is not None:
            cfg = with_overrides(cfg, "cluster", role=role)
        setup_logging(verbose + 1, level=cfg.log.level, json_lines=cfg.log.json)
        server = VaultServer(cfg)
    except (ConfigError, TierKVError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    try:
        server.serve_forever(ready_file=ready_file)
    except PortInUseError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(3) from exc


@app.command()
def status(
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Per-vault deadline in seconds.")] = None,
    verbose: Verbose = 0,
) -> None:
    """Ask every vault in tierkv.toml over RPC; exit 1 if any is unreachable."""
    from tierkv.status import cluster_status, status_table

    cfg = _load(config)
    setup_logging(verbose, level=cfg.log.level)
    nodes = cluster_status(cfg, timeout)
    if as_json:
        print(json.dumps({"config": cfg.source, "nodes": [n.as_dict() for n in nodes]}, indent=2))
    else:
        table = status_table(nodes, f"tierkv status ({cfg.source})")
        out.print(table)
        for n in nodes:
            if not n.reachable:
                err.print(f"[red]{n.role} {n.address}:[/red] {n.error}")
    if not all(n.reachable for n in nodes):
        raise typer.Exit(1)


@app.command()
def demo(
    state_dir: Annotated[
        str, typer.Option(help="Where the demo vaults keep their LMDB files.")
    ] = ".state/demo",
    tokens: Annotated[int, typer.Option(help="Prompt length of the synthetic workload.")] = 4096,
    verbose: Verbose = 0,
) -> None:
    """Start two vaults on loopback, store and restore a synthetic KV workload, stop them."""
    from pathlib import Path

    from tierkv.demo import run_demo

    setup_logging(verbose)
    result = run_demo(Path(state_dir), out, tokens=tokens)
    if not result.ok:
        raise typer.Exit(1)


@app.command()
def bench(
    config: ConfigOpt = None,
    shape: Annotated[
        str,
        typer.Option(
            "--shape",
            "--model-shape",
            help="qwen2.5-0.5b, llama3-8b, qwen3.6-35b-a3b or custom:LAYERS,KV_HEADS,HEAD_DIM,DTYPE.",
        ),
    ] = "qwen2.5-0.5b",
    tokens: Annotated[
        str | None,
        typer.Option(
            "--tokens",
            "--lengths",
            help="Prompt lengths, comma-separated (4k = 4096). Default: 1k,4k,16k; --hf 512,2048; "
            "--engine-api 1k,4k.",
        ),
    ] = None,
    codec: Annotated[str, typer.Option(help="Codecs to compare (--hf uses the first).")] = "raw,int8",
    repeats: Annotated[int | None, typer.Option(help="Repeats per length (default 3; --hf 2).")] = None,
    block_tokens: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    batch_mib: Annotated[float, typer.Option(help="Synthetic: MiB of KV per Put / BatchGet.")] = 16.0,
    ssm_every: Annotated[
        int, typer.Option(help="Synthetic hybrid shapes: state snapshot every N tokens.")
    ] = 1024,
    max_seconds: Annotated[
        float | None, typer.Option(help="Stop the sweep after this long (default 120; --hf 300; engine 900).")
    ] = None,
    prefill_tps: Annotated[
        float | None, typer.Option(help="Synthetic: your prefill rate in tokens/s, for a break-even length.")
    ] = None,
    prefill_at: Annotated[
        int | None, typer.Option(help="Prompt length --prefill-tps was measured at.")
    ] = None,
    vaults: Annotated[
        str, typer.Option(help="auto (configured if reachable, else started here), config or local.")
    ] = "auto",
    state_dir: Annotated[str | None, typer.Option(help="LMDB directory for vaults started here.")] = None,
    vault_max_bytes: Annotated[str, typer.Option(help="Minimum budget of vaults started here.")] = "1GiB",
    vault_sync: Annotated[str, typer.Option(help="durable or fast, for vaults started here.")] = "durable",
    hf: Annotated[
        bool, typer.Option("--hf", help="Prefill vs hot vs cold restore with transformers.")
    ] = False,
    device: Annotated[str, typer.Option(help="--hf: cpu or cuda.")] = "cpu",
    engine_api: Annotated[
        str | None, typer.Option(help="Base URL of an OpenAI-compatible server (vLLM, EXO).")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="--engine-api: model name (default: GET /v1/models).")
    ] = None,
    api: Annotated[str, typer.Option(help="--engine-api: auto, completions or chat.")] = "auto",
    evict: Annotated[
        str, typer.Option(help="--engine-api: auto, reset (POST /reset_prefix_cache), flood or none.")
    ] = "auto",
    flood_tokens: Annotated[
        int, typer.Option(help="--engine-api: tokens of unrelated prompts to evict.")
    ] = 65536,
    settle: Annotated[
        float, typer.Option(help="--engine-api: seconds for stores to land before eviction.")
    ] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(help="--engine-api: tokens generated per request.")] = 4,
    min_speedup: Annotated[
        float | None,
        typer.Option(help="--hf / --engine-api: fail when restored TTFT is not this much faster."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data and prompts.")] = 0,
    json_out: Annotated[
        str | None, typer.Option("--json", help="Write every figure as JSON to PATH ('-': stdout).")
    ] = None,
    verbose: Verbose = 0,
) -> None:
    """Measure whether tiering pays here: store/restore throughput, TTFT, and the break-even length."""
    from tierkv.bench import BenchError
    from tierkv.bench.record import write_json
    from tierkv.bench.runner import BenchRequest, render_result, run_bench

    cfg = _load(config)
    setup_logging(verbose, level=cfg.log.level)
    console = err if json_out == "-" else out
    request = BenchRequest(
        shape=shape,
        tokens=tokens,
        codecs=codec,
        repeats=repeats,
        block_tokens=block_tokens,
        batch_mib=batch_mib,
        ssm_every=ssm_every,
        max_seconds=max_seconds,
        prefill_tps=prefill_tps,
        prefill_at=prefill_at,
        vaults=vaults,
        state_dir=state_dir,
        vault_max_bytes=vault_max_bytes,
        vault_sync=vault_sync,
        hf=hf,
        device=device,
        engine_api=engine_api,
        model=model,
        api=api,
        evict=evict,
        flood_tokens=flood_tokens,
        settle_s=settle,
        max_new_tokens=max_new_tokens,
        min_speedup=min_speedup,
        seed=seed,
    )
    try:
        result = run_bench(request, cfg, console)
    except (BenchError, TierKVError) as exc:
        err.print(f"[red]bench error:[/red] {exc}")
        raise typer.Exit(2) from exc
    render_result(result, console)
    if json_out:
        write_json(result.document(), json_out)
    if not result.ok:
        raise typer.Exit(1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
