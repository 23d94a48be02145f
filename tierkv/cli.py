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


from tierkv.bench.cli import bench_app  # noqa: E402  (its modes import their heavy parts on use)

app.add_typer(bench_app, name="bench")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
