"""The ``tierkv`` command: thin — parse flags, call the library, render with rich.

Exit codes: 0 fine, 1 a vault unreachable or a check failed, 2 a bad config, flag or environment (one
line naming the file, the key and what was expected; never a traceback), 3 the vault's port is taken.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from tierkv import __version__
from tierkv.config import (
    Config,
    VaultConfig,
    check_client_files,
    check_vault_start,
    config_to_dict,
    format_size,
    to_toml,
    with_overrides,
)
from tierkv.console import err, escape, out
from tierkv.console import fail as _fail
from tierkv.console import load as _load
from tierkv.errors import ConfigError, TierKVError
from tierkv.extras import MissingExtra, install_hint
from tierkv.logs import setup_logging
from tierkv.roles import Role

if TYPE_CHECKING:
    from tierkv.admin import Answer, Target
    from tierkv.status import NodeStatus

# plain help: flags without a value placeholder (``--json``, not ``--json <bool>``), defaults shown
_APP_STYLE = {
    "no_args_is_help": True,
    "rich_markup_mode": None,
    "context_settings": {"help_option_names": ["-h", "--help"]},
}
app = typer.Typer(
    name="tierkv",
    help="KV-cache tiering for LLM inference.",
    epilog="Environment: TIERKV_CONFIG names the config file; TIERKV_TOKEN holds the auth token "
    "(unless [auth] token_file or token_env say otherwise).",
    add_completion=False,
    pretty_exceptions_enable=False,
    **_APP_STYLE,  # type: ignore[arg-type]
)

ConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        "-c",
        help="tierkv.toml (default: $TIERKV_CONFIG, ./tierkv.toml, ~/.config/tierkv/tierkv.toml)",
    ),
]
Verbose = Annotated[
    int,
    typer.Option("--verbose", "-v", count=True, show_default=False, help="More log output (-vv for debug)."),
]
_VAULT = VaultConfig()
JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _setup_logging(cfg: Config, verbosity: int) -> None:
    try:
        setup_logging(
            verbosity, level=cfg.log.level, json_lines=cfg.log.json, file=cfg.log.file, source=cfg.source
        )
    except ConfigError as exc:
        _fail(exc, "config error")


def _version(value: bool) -> None:
    if value:
        out().print(f"tierkv {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """tierkv keeps KV cache that a GPU would throw away, on vault daemons, and brings it back."""


# `tierkv vault` runs the daemon; its subcommands work on a vault's directory
vault_app = typer.Typer(**{**_APP_STYLE, "no_args_is_help": False})  # type: ignore[arg-type]
app.add_typer(vault_app, name="vault")


@vault_app.callback(invoke_without_command=True)
def vault(
    ctx: typer.Context,
    config: ConfigOpt = None,
    host: Annotated[
        str | None,
        typer.Option(
            help=f"Bind address (default {_VAULT.host}; with no token, loopback only unless allowed)."
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help=f"gRPC port (default {_VAULT.port}; 0 picks a free one).")
    ] = None,
    path: Annotated[
        str | None, typer.Option(help="LMDB directory (default: $XDG_DATA_HOME/tierkv/vault-PORT).")
    ] = None,
    max_bytes: Annotated[
        str | None, typer.Option(help=f"Byte budget (default {format_size(_VAULT.max_bytes)}).")
    ] = None,
    sync: Annotated[
        str | None, typer.Option(help=f"durable (fsync per batch) or fast (default {_VAULT.sync}).")
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(help=f"Eviction policy: adaptive, lru, priority-lru, context (default {_VAULT.policy})"),
    ] = None,
    role: Annotated[
        str | None, typer.Option(help="Role this vault serves: kv_cold or ssm_cold (default kv_cold).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus /metrics port (default 0: off).")
    ] = None,
    on_damage: Annotated[
        str | None,
        typer.Option(help="A damaged data.mdb: refuse to start (default) or move-aside and start empty."),
    ] = None,
    ready_file: Annotated[str | None, typer.Option(help="Write the bound port here once serving.")] = None,
    verbose: Verbose = 0,
) -> None:
    """Run one vault in the foreground until SIGTERM or SIGINT.

    Flags override tierkv.toml's [vault] section. With a token ([auth] token_file, else $TIERKV_TOKEN)
    every data call must carry it.
    """
    flags = {name: value for name, value in locals().items() if name != "ctx"}  # the options, by name
    if ctx.invoked_subcommand is not None:
        return
    serve_vault(**flags)


def serve_vault(
    *,
    config: str | None = None,
    host: str | None = None,
    port: int | None = None,
    path: str | None = None,
    max_bytes: str | None = None,
    sync: str | None = None,
    policy: str | None = None,
    role: str | None = None,
    metrics_port: int | None = None,
    on_damage: str | None = None,
    ready_file: str | None = None,
    verbose: int = 0,
) -> None:
    """``tierkv vault`` once its flags are parsed (by typer, or by :func:`plain_vault_flags`)."""
    cfg = _load(config)
    try:
        cfg = with_overrides(
            cfg,
            "vault",
            host=host,
            port=port,
            path=path,
            max_bytes=max_bytes,
            sync=sync,
            policy=policy,
            metrics_port=metrics_port,
            on_damage=on_damage,
        )
        if role is not None:
            cfg = with_overrides(cfg, "cluster", role=_vault_role(role))
        check_vault_start(cfg, ready_file=ready_file, before_disk=functools.partial(_check_open, cfg))
        _setup_logging(cfg, verbose + 1)
        from tierkv.vault.server import PortInUseError, VaultServer

        server = VaultServer(cfg)
    except TierKVError as exc:
        _fail(exc, code=getattr(exc, "exit_code", 2))
    try:
        server.serve_forever(ready_file=ready_file)
    except PortInUseError as exc:
        _fail(exc, code=3)


def _check_open(cfg: Config) -> None:
    """The vault's rule for running without a token (:func:`tierkv.vault.auth.check_open`), asked before
    the start makes anything on disk (the server asks again)."""
    from tierkv.vault.auth import check_open, load_tokens

    check_open(load_tokens(cfg.auth, cfg.source), cfg.auth, cfg.vault.host, cfg.source_of("vault.host"))


VAULT_OPTIONS: dict[str, tuple[str, type[str] | type[int]]] = {
    "--config": ("config", str),
    "-c": ("config", str),
    "--host": ("host", str),
    "--port": ("port", int),
    "--path": ("path", str),
    "--max-bytes": ("max_bytes", str),
    "--sync": ("sync", str),
    "--policy": ("policy", str),
    "--role": ("role", str),
    "--metrics-port": ("metrics_port", int),
    "--on-damage": ("on_damage", str),
    "--ready-file": ("ready_file", str),
}
"""The options of ``tierkv vault`` that take a value: the name :func:`serve_vault` takes, and its type."""
VERBOSE_FLAGS = ("-v", "--verbose")


def plain_vault_flags(args: Sequence[str]) -> dict[str, Any] | None:
    """The flags of a plainly spelled ``tierkv vault`` command line, as typer would parse them; None for
    anything else, which typer parses.

    Plain is what the launcher, the service files and most people write: ``vault``, then options each
    given once as ``--name VALUE`` (or ``-v``), whole numbers in digits. Parsing those here skips typer's
    building of every command and of a pydantic validator per option, which was a fifth of a vault's
    start. Help, subcommands, ``--name=VALUE``, repeated, unknown or dash-led values, and numbers typer
    would have to judge all go to typer, so its help, errors and exit codes are what the user sees.
    """
    if list(args[:1]) != ["vault"] or any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None  # not `tierkv vault`, or a shell asking typer to complete a word
    flags: dict[str, Any] = {"verbose": 0}
    rest = list(args[1:])
    while rest:
        token = rest.pop(0)
        if token in VERBOSE_FLAGS:
            flags["verbose"] += 1
            continue
        name, kind = VAULT_OPTIONS.get(token, ("", str))
        value = rest.pop(0) if rest else "-"
        if not name or name in flags or not _plain_value(value, kind):
            return None
        flags[name] = kind(value)
    return flags


def _plain_value(value: str, kind: type) -> bool:
    """A value typer takes as it is: not dash-led (an option? typer decides), a number in a few digits."""
    if value.startswith("-"):
        return False
    return kind is not int or (value.isascii() and value.isdigit() and len(value) <= 9)


VaultDir = Annotated[str, typer.Argument(help="The vault's LMDB directory (its --path).")]


@vault_app.command("compact")
def vault_compact(path: VaultDir) -> None:
    """Rewrite the store without its free pages (stop the vault first; it refuses while one runs)."""
    from tierkv.vault.compact import compact

    try:
        result = compact(path)
    except TierKVError as exc:
        _fail(exc, code=getattr(exc, "exit_code", 2))
    out().print(f"compacted {result.target}: {format_size(result.before)} -> {format_size(result.after)}")


@vault_app.command("backup")
def vault_backup(
    path: VaultDir, dest: Annotated[str, typer.Argument(help="A new directory for the copy.")]
) -> None:
    """Copy the store, compacted, into DEST (safe while the vault runs); DEST can serve as a --path."""
    from tierkv.vault.compact import backup

    try:
        result = backup(path, dest)
    except TierKVError as exc:
        _fail(exc, code=getattr(exc, "exit_code", 2))
    out().print(f"backed up {result.source} ({format_size(result.before)}) to {result.target}")


admin_app = typer.Typer(
    help="Operator commands on running vaults (namespaces, inspect, flush) and on a store (backup, compact).",
    **_APP_STYLE,  # type: ignore[arg-type]
)
app.add_typer(admin_app, name="admin")

VaultOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--vault",
        metavar="HOST:PORT",
        help="Ask this vault (repeatable; default: every vault in tierkv.toml).",
    ),
]
TenantOpt = Annotated[
    str, typer.Option(help="Act in this tenant's namespaces (admin tokens only; default: the token's own).")
]


def _positive_seconds(value: float | None) -> float | None:
    """A deadline of 0 or less times every call out at once, and each vault would show as unreachable."""
    if value is not None and value <= 0:
        raise typer.BadParameter(f"expected a positive number of seconds, got {value:g}")
    return value


AdminTimeout = Annotated[
    float,
    typer.Option(
        help="Per-vault deadline in seconds (listing reads the whole index).", callback=_positive_seconds
    ),
]
ADMIN_TIMEOUT_S = 30.0
NamespaceArg = Annotated[
    str, typer.Argument(help="The namespace, in hex (as `tierkv admin namespaces` shows it).")
]


def _admin_setup(config: str | None, vault: list[str] | None) -> tuple[Config, list[Target]]:
    from tierkv import admin

    cfg = _load(config)
    setup_logging(0)
    try:
        check_client_files(cfg)
        return cfg, admin.targets(cfg, vault or ())
    except ConfigError as exc:
        _fail(exc, "config error")


def _report_errors(answers: Sequence[Answer[Any]]) -> None:
    """A red line per vault that failed; exit 1 if any did."""
    for a in answers:
        if a.error is not None:
            err().print(f"[red]{a.target.address}:[/red] {escape(str(a.error))}", soft_wrap=True)
    if any(not a.ok for a in answers):
        raise typer.Exit(1)


@admin_app.command("namespaces")
def admin_namespaces(
    config: ConfigOpt = None,
    vault: VaultOpt = None,
    tenant: TenantOpt = "",
    limit: Annotated[
        int, typer.Option(min=0, help="At most N namespaces per vault (0: the vault's cap).")
    ] = 0,
    timeout: AdminTimeout = ADMIN_TIMEOUT_S,
    as_json: JsonFlag = False,
) -> None:
    """List namespaces with their keys and bytes per tenant (a user token sees its own tenant's)."""
    from tierkv import admin

    cfg, where = _admin_setup(config, vault)
    answers = admin.ask(cfg, where, lambda c: c.list_namespaces(tenant=tenant, limit=limit), timeout)
    if as_json:
        print(json.dumps(admin.namespaces_doc(answers), indent=2))
    elif any(a.ok for a in answers):  # no empty table above the errors of vaults that all refused
        out().print(admin.namespaces_table(answers, f"tierkv namespaces ({cfg.source})"))
        out().print(
            f"model: {admin.UNKNOWN_MODEL}; the sample header says what its blocks hold", highlight=False
        )
    _report_errors(answers)


@admin_app.command("inspect")
def admin_inspect(
    namespace: NamespaceArg,
    key: Annotated[str, typer.Argument(help="The key, in hex.")],
    config: ConfigOpt = None,
    vault: VaultOpt = None,
    tenant: TenantOpt = "",
    timeout: AdminTimeout = ADMIN_TIMEOUT_S,
    as_json: JsonFlag = False,
) -> None:
    """One key on each vault: blob header, size and the retention figures the vault keeps (class,
    importance, protected, expiry, decayed hits, children). Reading it is not a hit."""
    from tierkv import admin

    cfg, where = _admin_setup(config, vault)
    try:
        ns, raw_key = admin.parse_hex(namespace, "NAMESPACE"), admin.parse_hex(key, "KEY")
    except ConfigError as exc:
        _fail(exc)
    answers = admin.ask(cfg, where, lambda c: c.inspect(ns, raw_key, tenant=tenant), timeout)
    if as_json:
        print(json.dumps(admin.inspect_doc(ns, raw_key, answers), indent=2))
    else:
        for a in answers:
            if a.value is not None:
                out().print(f"[bold]{a.target.address}[/bold] {a.target.role}".rstrip())
                for line in admin.entry_lines(a.value):
                    out().print(f"  {escape(line)}", highlight=False)
    _report_errors(answers)


@admin_app.command("flush")
def admin_flush(
    namespace: Annotated[
        str | None, typer.Argument(help="The namespace to empty, in hex (or --all).", show_default=False)
    ] = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all", help="Empty every namespace (admin tokens only).")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    config: ConfigOpt = None,
    vault: VaultOpt = None,
    tenant: TenantOpt = "",
    timeout: AdminTimeout = ADMIN_TIMEOUT_S,
) -> None:
    """Delete every entry of one namespace, or with --all of every namespace (of --tenant, else of every
    tenant), on each vault. Asks for confirmation unless --yes."""
    from tierkv import admin

    if bool(namespace) == all_namespaces:
        _fail(ValueError("name a namespace (hex) or pass --all, not both or neither"))
    cfg, where = _admin_setup(config, vault)
    try:
        ns = admin.parse_hex(namespace, "NAMESPACE") if namespace else b""
    except ConfigError as exc:
        _fail(exc)
    if all_namespaces:
        _check_admin(cfg, where, timeout)
    scope = f"namespace {namespace}" if namespace else "EVERY namespace"
    whose = f"tenant {tenant}" if tenant else ("every tenant" if all_namespaces else "this token's tenant")
    if not yes and not typer.confirm(f"Flush {scope} of {whose} on {len(where)} vault(s)?", default=False):
        err().print("not flushed")
        raise typer.Exit(1)
    answers = admin.ask(
        cfg, where, lambda c: c.flush(ns, all_namespaces=all_namespaces, tenant=tenant), timeout
    )
    for a in answers:
        if a.value is not None:
            out().print(f"{a.target.address}: deleted {a.value:,} entries", highlight=False)
    _report_errors(answers)


# the store commands are `tierkv vault`'s too: an operator finds them under either
admin_app.command("backup")(vault_backup)
admin_app.command("compact")(vault_compact)


def _check_admin(cfg: Config, where: Sequence[Target], timeout: float) -> None:
    """Before asking anyone to confirm --all: every vault must take this token as an admin."""
    from tierkv import admin

    answers = admin.ask(cfg, where, lambda c: c.stats(), timeout)
    _report_errors(answers)
    users = [a for a in answers if a.value is not None and a.value.access == "user"]
    if users:
        tenant = users[0].value.tenant if users[0].value else ""
        problem = f"flushing every namespace needs an admin token; this one is a user of tenant {tenant!r}"
        _fail(PermissionError(problem), code=1)


def _vault_role(role: str) -> str:
    if role == Role.INFERENCE:
        problem = "a vault serves kv_cold or ssm_cold; inference is the engine's side (it runs no vault)"
        raise ConfigError("command line", "--role", problem)
    return role


@app.command()
def status(
    config: ConfigOpt = None,
    as_json: JsonFlag = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="Per-vault deadline in seconds (default: [cluster] timeout).", callback=_positive_seconds
        ),
    ] = None,
    watch: Annotated[
        float,
        typer.Option(
            "--watch", "-w", min=0, metavar="SECONDS", help="Refresh every N seconds until Ctrl-C (0: once)."
        ),
    ] = 0,
    count: Annotated[
        int, typer.Option(min=0, metavar="N", help="With --watch: stop after N refreshes (0: no limit).")
    ] = 0,
    verbose: Verbose = 0,
) -> None:
    """Ask every vault in tierkv.toml over RPC; exit 1 if any is unreachable or refuses the token.

    The token comes from [auth] token_file, else $TIERKV_TOKEN. A config error exits 2.
    """
    from tierkv.status import cluster_status

    cfg = _load(config)
    _setup_logging(cfg, verbose)
    try:
        check_client_files(cfg)
    except ConfigError as exc:
        _fail(exc, "config error")
    healthy, rounds = True, 0
    try:
        while True:
            healthy = _show_status(cfg, cluster_status(cfg, timeout), as_json=as_json, watching=watch > 0)
            rounds += 1
            if not watch or (count and rounds >= count):
                break
            time.sleep(watch)
    except KeyboardInterrupt:
        pass
    if not healthy:
        raise typer.Exit(1)


def _show_status(cfg: Config, nodes: list[NodeStatus], *, as_json: bool, watching: bool) -> bool:
    """Print one round (a JSON line per round when watching); True when every vault answered."""
    from tierkv.status import status_table

    if as_json:
        doc = {"config": cfg.source, "time": time.time(), "nodes": [n.as_dict() for n in nodes]}
        print(json.dumps(doc, indent=None if watching else 2), flush=True)
    else:
        if watching and out().is_terminal:
            out().clear()
        stamp = time.strftime(" %H:%M:%S") if watching else ""
        out().print(status_table(nodes, f"tierkv status ({cfg.source}){stamp}", width=out().width))
        _status_notes(cfg, nodes)
    return all(n.reachable for n in nodes)


def _status_notes(cfg: Config, nodes: list[NodeStatus]) -> None:
    """Below the table, on stderr: why each vault could not be asked, which answer anyone, and a hint when
    the file's own vault is not among those asked."""
    from tierkv.status import AUTH_REFUSED, refused_hint, unlisted_vault

    for n in nodes:
        if not n.reachable:
            err().print(f"[red]{n.role} {n.address} {n.state}:[/red] {escape(n.error)}")
            if n.state == AUTH_REFUSED:
                err().print(f"  {escape(refused_hint(cfg))}", soft_wrap=True)
        elif n.auth == "off":
            err().print(
                f"[yellow]{n.role} {n.address}: auth is OFF:[/yellow] it answers callers without a "
                "token, each an admin of tenant 'default'",
                soft_wrap=True,
            )
    hint = "" if all(n.reachable for n in nodes) else unlisted_vault(cfg)
    if hint:
        err().print(f"[yellow]hint:[/yellow] {escape(hint)}", soft_wrap=True)


@app.command()
def snapshot(
    output: Annotated[Path, typer.Option("--output", "-o", help="Write the snapshot here.")] = Path(
        "tierkv-snapshot.json"
    ),
    config: ConfigOpt = None,
    vault: VaultOpt = None,
    tenant: TenantOpt = "",
    limit: Annotated[int, typer.Option(min=1, help="At most N prefixes per tenant and namespace.")] = 32,
    timeout: AdminTimeout = ADMIN_TIMEOUT_S,
) -> None:
    """Record the hottest prefixes (with their token ids) of every tenant and namespace on the kv_cold
    vaults, for `tierkv warm`. Blocks carry token ids only with [retention] warm_tokens = true."""
    from tierkv.warm import take_snapshot

    cfg, _ = _admin_setup(config, vault)
    snap = take_snapshot(cfg, vaults=vault or (), tenant=tenant, limit=limit, timeout=timeout)
    for line in snap.errors:
        err().print(f"[red]{escape(line)}[/red]", soft_wrap=True)
    if snap.errors and not snap.prefixes:
        # an empty file would replace the last good snapshot while a vault is merely down
        err().print(f"nothing written to {output}: not every vault answered, and no prefix came back")
        raise typer.Exit(1)
    snap.write(output)
    tokens = sum(len(p.tokens) for p in snap.prefixes)
    out().print(f"{len(snap.prefixes)} prefixes ({tokens} tokens) written to {output}", highlight=False)
    if snap.skipped:
        out().print(f"{snap.skipped} hot chains without token ids skipped (warm_tokens off when stored?)")
    if not snap.prefixes:
        out().print(
            escape(
                "nothing to warm: engines send a block's token ids only with [retention] warm_tokens = true "
                "in their tierkv.toml (off by default), and a chain is hot once it was read"
            ),
            highlight=False,
        )
    if snap.errors:
        raise typer.Exit(1)


@app.command()
def warm(
    engine_api: Annotated[str, typer.Option("--engine-api", help="The engine's OpenAI API base URL.")],
    snapshot_file: Annotated[Path, typer.Option("--snapshot", help="A file from `tierkv snapshot`.")] = Path(
        "tierkv-snapshot.json"
    ),
    model: Annotated[str, typer.Option(help="Model name to send (default: the engine's first).")] = "",
    timeout: Annotated[float, typer.Option(min=0.001, help="Per-request deadline in seconds.")] = 120.0,
) -> None:
    """Replay a snapshot's prefixes into a freshly started engine as one-token requests, so its
    connector restores them into the GPU cache; prints each request's time and the total."""
    from tierkv.warm import SnapshotError, engine_model, load_snapshot, replay

    try:
        snap = load_snapshot(snapshot_file)
    except SnapshotError as exc:
        _fail(exc, "snapshot error")
    try:
        name = model or engine_model(engine_api, timeout)
    except (OSError, ValueError) as exc:
        _fail(exc, f"engine {engine_api}", code=1)

    def show(r: Any) -> None:
        state = "ok" if r.ok else f"[red]failed[/red] {escape(r.error)}"
        p = r.prefix
        out().print(
            f"{p.tenant} {p.namespace.hex()[:12]} {len(p.tokens)} tokens: {r.seconds * 1000:.1f} ms {state}"
        )

    done = replay(snap.prefixes, engine_api, model=name, timeout=timeout, progress=show)
    total = sum(r.seconds for r in done)
    failed = sum(not r.ok for r in done)
    out().print(f"warmed {len(done) - failed} of {len(done)} prefixes in {total:.2f} s", highlight=False)
    if failed:
        raise typer.Exit(1)


@app.command(
    "llama-serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def llama_serve(ctx: typer.Context) -> None:
    """llama-cpp-python's OpenAI server with the tiered cache (tierkv[llamacpp]).

    --tierkv-config, --tierkv-block-size and --tierkv-tenant are tierkv's; every other flag is
    llama_cpp.server's (--model, --host, --port, --n_ctx, --flash_attn, --type_k ...; --help lists both).
    """
    from tierkv.connectors.llamacpp.serve import main as serve

    serve(ctx.args)


@app.command()
def demo(
    state_dir: Annotated[
        str, typer.Option(help="Where the demo vaults keep their LMDB files.")
    ] = ".state/demo",
    tokens: Annotated[
        int, typer.Option(help="Prompt length of the synthetic workload (at least one 16-token block).")
    ] = 4096,
    cluster: Annotated[
        bool,
        typer.Option(
            "--cluster",
            help="Instead: two CPU vLLM replicas, two vaults and vllm-router kv_aware, with an agent trace "
            "(needs the vLLM environment, scripts/setup-vllm-env.sh).",
        ),
    ] = False,
    verbose: Verbose = 0,
) -> None:
    """Start two vaults on loopback, store and restore a synthetic KV workload, stop them."""
    from tierkv.demo import run_demo

    setup_logging(verbose)
    if cluster:
        from tierkv.routing.demo import run_cluster_demo

        try:
            served = run_cluster_demo(Path(state_dir) / "cluster", out())
        except (RuntimeError, TimeoutError) as exc:
            _fail(exc, code=1)
        if not any(r.restored for r in served):
            raise typer.Exit(1)
        return
    try:
        result = run_demo(Path(state_dir), out(), tokens=tokens)
    except ValueError as exc:
        _fail(exc)
    if not result.ok:
        raise typer.Exit(1)


@app.command()
def pages(
    replica: Annotated[
        list[str] | None,
        typer.Option(
            "--replica",
            metavar="NAME=ENDPOINT",
            help="A vLLM replica's KV event replay endpoint (repeatable).",
        ),
    ] = None,
    config: ConfigOpt = None,
    vault: VaultOpt = None,
    block_tokens: Annotated[
        int,
        typer.Option(
            min=1,
            help="Tokens per vault block where a namespace's blob headers do not say (chains without ids).",
        ),
    ] = 32,
    timeout: Annotated[
        float, typer.Option(help="Per replica and vault deadline in seconds.", callback=_positive_seconds)
    ] = 10.0,
    as_json: JsonFlag = False,
) -> None:
    """Which prefixes sit on which replica's GPU and in the vaults, per tenant and class, and their tokens."""
    from tierkv.routing.pages import collect, document, table

    cfg, where = _admin_setup(config, vault)
    try:
        found, errors = collect(cfg, where, replica or [], block_tokens, timeout)
    except ValueError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(document(found, errors), indent=2))
    else:
        for line in table(found):
            out().print(line, highlight=False, soft_wrap=True)
        for line in errors:
            err().print(f"[red]{escape(line)}[/red]", soft_wrap=True)
    if errors:
        raise typer.Exit(1)


from tierkv.bench.cli import bench_app  # noqa: E402  (its modes import their heavy parts on use)

app.add_typer(bench_app, name="bench")


config_app = typer.Typer(help="Check, show or write tierkv.toml.", **_APP_STYLE)  # type: ignore[arg-type]
app.add_typer(config_app, name="config")


@config_app.command("check")
def config_check(
    config: ConfigOpt = None,
    vault: Annotated[
        bool,
        typer.Option(
            "--vault", help="Also check what `tierkv vault` needs here: data directory, bind address, ports."
        ),
    ] = False,
) -> None:
    """Validate tierkv.toml and the files it names; exit 0 when usable, 2 (with the reason) when not.

    With ``--vault`` the token file is read by the vault's own parser, so what passes here starts."""
    cfg = _load(config)
    from tierkv.vault.auth import exposure_warning, load_tokens

    auth = ""
    warnings: list[str | None] = []
    try:
        if vault:
            tokens = load_tokens(cfg.auth, cfg.source)
            tokens.check_budget(cfg.vault.max_bytes, cfg.source)
            auth = tokens.describe()
            warnings.extend(tokens.warnings)
        check_client_files(cfg)
        warnings.append(exposure_warning(cfg.auth))
        for warning in filter(None, warnings):
            err().print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True)
        if vault:
            check_vault_start(cfg, create=False, before_disk=functools.partial(_check_open, cfg))
    except ConfigError as exc:
        _fail(exc, "config error")
    roles = ", ".join(f"{len(cfg.cluster.addresses(r))} {r}" for r in (Role.KV_COLD, Role.SSM_COLD))
    out().print(f"{escape(cfg.source)}: ok (role {cfg.cluster.role}; vaults: {roles})", highlight=False)
    if auth:
        out().print(f"vault {escape(auth)}", highlight=False, soft_wrap=True)


@config_app.command("show")
def config_show(config: ConfigOpt = None, as_json: JsonFlag = False) -> None:
    """Print the effective config: the file's values with every default filled in."""
    cfg = _load(config)
    data = config_to_dict(cfg)
    if as_json:
        print(json.dumps({"source": cfg.source, **data}, indent=2))
    else:
        print(f"# effective tierkv config, from {cfg.source}\n{to_toml(data)}", end="")


def _data_file(name: str) -> str:
    """A file shipped in ``tierkv/data`` (importlib.resources is imported here, not at start-up)."""
    from importlib.resources import files

    return (files("tierkv") / "data" / name).read_text()


@config_app.command("init")
def config_init(
    path: Annotated[str, typer.Argument(help="Where to write it ('-': print it).")] = "tierkv.toml",
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write the example tierkv.toml: every key with its default and what it does."""
    text = _data_file("tierkv.toml.example")
    if path == "-":
        print(text, end="")
        return
    target = Path(path).expanduser()
    if target.exists() and not force:
        _fail(FileExistsError(f"{target} exists (--force overwrites it)"))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)  # /etc/tierkv/ on a fresh machine
        target.write_text(text)
    except OSError as exc:
        _fail(OSError(f"cannot write {target}: {exc.strerror or exc}"))
    out().print(f"wrote {escape(str(target))}", highlight=False)


exo_app = typer.Typer(help="Install the EXO adapter into an EXO environment (an import hook).", **_APP_STYLE)  # type: ignore[arg-type]
app.add_typer(exo_app, name="exo")
ExoPython = Annotated[
    str | None, typer.Option("--python", help="EXO's interpreter (default: this one).", show_default=False)
]
ExoSiteDir = Annotated[
    str | None, typer.Option("--site-dir", help="Site directory to use instead of its site-packages.")
]


def _exo(action: str, python: str | None, site_dir: str | None) -> Any:
    """Run one of :mod:`tierkv.connectors.exo.install`'s actions; its refusals exit 2 with the reason."""
    from tierkv.connectors.exo import install as exo

    try:
        return getattr(exo, action)(python, site_dir)
    except exo.InstallError as exc:
        _fail(exc, f"exo {action}")


def _print_lines(lines: list[str]) -> None:
    for line in lines:
        out().print(escape(line), highlight=False)


@exo_app.command("install")
def exo_install(python: ExoPython = None, site_dir: ExoSiteDir = None) -> None:
    """Write tierkv's .pth import hook into EXO's site-packages (EXO's files are not touched)."""
    pth = _exo("install", python, site_dir)
    out().print(f"wrote {escape(str(pth))}", highlight=False)
    _print_lines(_exo("status", python, site_dir).lines()[2:])


@app.command(
    "mlx-serve",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
def mlx_serve(ctx: typer.Context) -> None:
    """mlx-lm's OpenAI server with a tiered prompt cache (tierkv[mlx]).

    --tierkv-config, --tierkv-block-size, --tierkv-codec and --tierkv-tenant are tierkv's; every other
    flag goes to mlx_lm.server (--model, --port, --prompt-cache-size ...; --help lists both).
    """
    from tierkv.connectors.mlx.serve import main as serve

    serve(list(ctx.args))


@app.command(
    "install",
    hidden=True,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
def legacy_install(ctx: typer.Context) -> None:
    """tierkv 0.1's ``install --exo-path DIR``: exit 2 naming the command that replaced it."""
    args = list(ctx.args)
    where = next((a.partition("=")[2] for a in args if a.startswith("--exo-path=")), "")
    if not where and "--exo-path" in args[:-1]:
        where = args[args.index("--exo-path") + 1]
    python = f"{where.rstrip('/')}/.venv/bin/python" if where else "EXO_DIR/.venv/bin/python"
    _fail(
        ValueError(
            "`tierkv install --exo-path` was tierkv 0.1's; the EXO hook is now installed into EXO's own "
            f"environment with: tierkv exo install --python {python}  (see tierkv exo -h)"
        )
    )


@exo_app.command("uninstall")
def exo_uninstall(python: ExoPython = None, site_dir: ExoSiteDir = None) -> None:
    """Remove exactly the .pth file `tierkv exo install` wrote."""
    pth = _exo("uninstall", python, site_dir)
    out().print(f"removed {escape(str(pth))}" if pth else "nothing to remove", highlight=False)


@exo_app.command("status")
def exo_status(python: ExoPython = None, site_dir: ExoSiteDir = None) -> None:
    """Say whether the hook is installed and whether the guard passes for that environment's EXO."""
    _print_lines(_exo("status", python, site_dir).lines())


class ServiceKind(str, enum.Enum):
    systemd = "systemd"
    launchd = "launchd"


SERVICE_FILES = {ServiceKind.systemd: "tierkv-vault.service", ServiceKind.launchd: "io.tierkv.vault.plist"}

service_app = typer.Typer(help="Run a vault as a service (systemd, launchd).", **_APP_STYLE)  # type: ignore[arg-type]
app.add_typer(service_app, name="service")


SHIPPED_EXEC = {
    ServiceKind.systemd: "/opt/tierkv/bin/tierkv",
    ServiceKind.launchd: "/Users/YOU/.local/tierkv/bin/tierkv",
}


@service_app.command("print")
def service_print(
    kind: Annotated[ServiceKind, typer.Argument(help="systemd (a unit) or launchd (a plist).")],
    exec_path: Annotated[
        str | None,
        typer.Option(
            "--exec", help="The tierkv to run (default: the one beside this Python).", show_default=False
        ),
    ] = None,
    user: Annotated[str, typer.Option(help="systemd: the user and group the vault runs as.")] = "tierkv",
) -> None:
    """Print the service definition for this install; redirect it into place (see the comments at its top)."""
    text = _data_file(SERVICE_FILES[kind])
    executable = exec_path or str(Path(sys.executable).parent / "tierkv")
    text = text.replace(SHIPPED_EXEC[kind], executable)
    if kind is ServiceKind.systemd:
        text = text.replace("User=tierkv\nGroup=tierkv", f"User={user}\nGroup={user}")
    else:
        text = text.replace("/Users/YOU", str(Path.home()))
    print(text, end="")


def run(prog_name: str | None = None) -> None:
    """The ``tierkv`` entry point: the app, with a missing optional dependency named by its extra.

    A plainly spelled ``tierkv vault`` (:func:`plain_vault_flags`) is run without building the app."""
    try:
        if (flags := plain_vault_flags(sys.argv[1:])) is not None:
            _standalone(serve_vault, flags)
        app(prog_name=prog_name)
    except MissingExtra as exc:
        _exit_missing(str(exc))
    except ModuleNotFoundError as exc:
        hint = install_hint(exc.name or "")
        if hint is None:
            raise
        _exit_missing(f"this command needs {exc.name}, which is not installed: {hint}")


def _standalone(command: Callable[..., None], kwargs: dict[str, Any]) -> NoReturn:
    """Run ``command`` and exit as typer's standalone mode would have: 0 when it returns, its code on
    ``typer.Exit``, 130 on Ctrl-C, 1 quietly when stdout or stderr is a closed pipe."""
    try:
        command(**kwargs)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # what is still buffered goes nowhere, quietly
        os.dup2(devnull, sys.stdout.fileno())
        os.dup2(devnull, sys.stderr.fileno())
        sys.exit(1)
    sys.exit(0)


def _exit_missing(message: str) -> NoReturn:
    err().print(f"[red]error:[/red] {escape(message)}")
    sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    run()
