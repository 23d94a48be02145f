"""``tierkv bench synthetic | hf | engine | mlx | llamacpp | trace``: a subcommand per mode, own options.

Bare ``tierkv bench`` is ``tierkv bench synthetic``. Before the subcommands the mode was a flag of one
command (``tierkv bench --hf ...``, ``tierkv bench --engine-api URL ...``, 26 options whatever the mode);
that spelling still works for one release: :class:`BenchGroup` rewrites it to the subcommand, drops the
options the mode never used, and prints the new spelling on stderr.

``synthetic`` and ``hf`` measure on vaults they start themselves on loopback unless told otherwise: a
bench writes gigabytes and must not evict a production vault's entries because a tierkv.toml was found.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from tierkv.errors import BenchError, TierKVError
from tierkv.logs import setup_logging

if TYPE_CHECKING:
    from rich.console import Console

    from tierkv.bench.runner import BenchResult
    from tierkv.config import Config


class BenchGroup(TyperGroup):
    """``tierkv bench``: no subcommand means ``synthetic``; the deprecated flag spelling is translated."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """``ctx`` is click's Context (or that of the copy of click newer typer releases carry)."""
        if not args:
            args = ["synthetic"]
        elif args[0] not in self.commands and args[0] not in ctx.help_option_names:
            try:
                args, dropped = legacy_args(args, self.commands)
            except ValueError as exc:
                typer.echo(f"bench error: {exc}", err=True)
                raise typer.Exit(2) from None
            typer.echo(deprecation_note(args, dropped), err=True)
        return super().parse_args(ctx, args)


def legacy_args(args: Sequence[str], commands: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``[--hf | --engine-api URL] OPTIONS`` as ``MODE [URL] OPTIONS``, and the options that mode lacks
    (which the flag spelling accepted and ignored). ``commands`` are the subcommands by name."""
    mode, head, rest = _legacy_mode(args)
    takes_value = {
        name: not (p.is_flag or p.count)
        for command in commands.values()
        for p in command.params
        if p.param_type_name == "option"
        for name in (*p.opts, *p.secondary_opts)
    }
    own = {name for p in commands[mode].params for name in (*p.opts, *p.secondary_opts)}
    kept: list[str] = []
    dropped: list[str] = []
    words = iter(rest)
    for arg in words:
        name, eq, _ = arg.partition("=")
        value = list(itertools.islice(words, 1)) if takes_value.get(name) and not eq else []
        (dropped if name in takes_value and name not in own else kept).extend([arg, *value])
    return [mode, *head, *kept], dropped


ENGINE_FLAGS = ("--engine-api", "--exo-api")
"""The flag spellings of ``engine`` mode (0.1 named EXO's API; EXO serves the same OpenAI API)."""


def _legacy_mode(args: Sequence[str]) -> tuple[str, list[str], list[str]]:
    """The mode the deprecated flags picked, its positional arguments, and the remaining words."""
    rest = [a for a in args if a != "--hf"]
    hf = len(rest) < len(args)
    for i, arg in enumerate(rest):
        name, eq, value = arg.partition("=")
        if name not in ENGINE_FLAGS:
            continue
        if not eq and i + 1 == len(rest):
            raise ValueError(f"{name} needs a URL")
        url = value if eq else rest[i + 1]
        del rest[i : i + (1 if eq else 2)]
        if hf:
            raise ValueError(f"--hf and {name} are separate modes: pick one")
        return "engine", [url], rest
    return ("hf" if hf else "synthetic"), [], rest


def deprecation_note(args: Sequence[str], dropped: Sequence[str]) -> str:
    """One line for stderr: the spelling to use from now on (and what was dropped from the old one)."""
    new = shlex.join(args)
    line = f"note: modes as flags are deprecated and go away in the next release; use: tierkv bench {new}"
    if dropped:
        line += f" (dropped {shlex.join(dropped)}: not used by {args[0]})"
    return line


bench_app = typer.Typer(
    cls=BenchGroup,
    help="Measure whether tiering pays here (bare `tierkv bench` runs `synthetic`).",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

VAULTS = "Vaults"
ConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        "-c",
        help="tierkv.toml (default: $TIERKV_CONFIG, ./tierkv.toml, ~/.config/tierkv/tierkv.toml); its "
        "vaults are measured on only when asked, its token and TLS apply to vaults named on the command line",
    ),
]
Lengths = Annotated[
    str, typer.Option("--tokens", "--lengths", help="Prompt lengths, comma-separated (4k = 4096).")
]
Repeats = Annotated[int, typer.Option(help="Repeats per length.")]
MaxSeconds = Annotated[float, typer.Option(help="Stop the sweep after this long (the run says so).")]
Shape = Annotated[
    str,
    typer.Option(
        "--shape",
        "--model-shape",
        help="qwen2.5-0.5b, llama3-8b, qwen3.6-35b-a3b or custom:LAYERS,KV_HEADS,HEAD_DIM,DTYPE.",
    ),
]
BlockTokens = Annotated[int, typer.Option(help="Tokens per KV block.")]
MinSpeedup = Annotated[
    float | None, typer.Option(help="Fail when restored TTFT is not this much faster than cold.")
]
Seed = Annotated[int, typer.Option(help="Seed of the data and prompts.")]
JsonOut = Annotated[
    str | None, typer.Option("--json", help="Write every figure as JSON to PATH ('-': stdout).")
]
Verbose = Annotated[int, typer.Option("--verbose", "-v", count=True, help="More log output (-vv for debug).")]
Vaults = Annotated[
    str,
    typer.Option(
        help="local: start vaults on loopback for this run; kv_cold=HOST:PORT[,ssm_cold=HOST:PORT...]: "
        "use those (they get written to); config: the ones in tierkv.toml; auto: configured if reachable.",
        rich_help_panel=VAULTS,
    ),
]
UseConfigVaults = Annotated[
    bool,
    typer.Option(
        "--use-config-vaults",
        help="Measure on the vaults in tierkv.toml (writes into them; may evict entries).",
        rich_help_panel=VAULTS,
    ),
]
StateDir = Annotated[
    str | None,
    typer.Option(
        help="LMDB directory for vaults started here (default: a temporary one).", rich_help_panel=VAULTS
    ),
]
VaultMaxBytes = Annotated[
    str, typer.Option(help="Minimum budget of vaults started here.", rich_help_panel=VAULTS)
]
VaultSync = Annotated[
    str, typer.Option(help="durable or fast, for vaults started here.", rich_help_panel=VAULTS)
]
LinkOpt = Annotated[
    str | None,
    typer.Option(
        "--link",
        help="Measure over an emulated link: RATE[,RTT] (5gbit,1ms) or 1gbe, 5gbe, 10gbe, 25gbe; the vaults "
        "start in a network namespace behind a shaped veth (needs root).",
        rich_help_panel=VAULTS,
    ),
]


def _run(
    config: str | None, verbose: int, json_out: str | None, measure: Callable[[Config, Console], BenchResult]
) -> None:
    """Load the config, run ``measure``, render; exit 2 on a setup error, 1 when the run failed."""
    from rich.markup import escape

    from tierkv.bench.record import write_json
    from tierkv.bench.runner import render_result
    from tierkv.console import err, load, out

    cfg = load(config)
    setup_logging(verbose, level=cfg.log.level)
    console = err() if json_out == "-" else out()
    try:
        result = measure(cfg, console)
    except (BenchError, TierKVError) as exc:
        # one line whatever the terminal's width; "[addr]:port" is text, not markup
        err().print(f"[red]bench error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from exc
    render_result(result, console)
    if json_out:
        write_json(result.document(), json_out)
    if not result.ok:
        raise typer.Exit(1)


@bench_app.command()
def synthetic(
    config: ConfigOpt = None,
    shape: Shape = "qwen2.5-0.5b",
    tokens: Lengths = "1k,4k,16k",
    codec: Annotated[str, typer.Option(help="Codecs to compare.")] = "raw,int8",
    repeats: Repeats = 3,
    block_tokens: BlockTokens = 16,
    batch_mib: Annotated[float, typer.Option(help="MiB of KV per Put / BatchGet.")] = 16.0,
    ssm_every: Annotated[int, typer.Option(help="Hybrid shapes: state snapshot every N tokens.")] = 1024,
    decoder: Annotated[
        str,
        typer.Option(
            help="Decoder of int8 restores: torch (as the engine hooks), numpy, auto (torch if installed)."
        ),
    ] = "auto",
    overlap: Annotated[
        str,
        typer.Option(
            help="int8 restores decode after each batch arrived (off, the hooks' default), while the rest "
            "arrives (on: [cluster] decode_behind), or both."
        ),
    ] = "off",
    decode_threads: Annotated[
        int, typer.Option(help="Threads per torch int8 decode (0: torch's default), in both restore paths.")
    ] = 0,
    max_seconds: MaxSeconds = 120.0,
    prefill_tps: Annotated[
        float | None, typer.Option(help="Your prefill rate in tokens/s, for a break-even length.")
    ] = None,
    prefill_at: Annotated[
        int | None, typer.Option(help="Prompt length --prefill-tps was measured at.")
    ] = None,
    vaults: Vaults = "local",
    use_config_vaults: UseConfigVaults = False,
    state_dir: StateDir = None,
    vault_max_bytes: VaultMaxBytes = "1GiB",
    vault_sync: VaultSync = "durable",
    link: LinkOpt = None,
    seed: Seed = 0,
    json_out: JsonOut = None,
    verbose: Verbose = 0,
) -> None:
    """Store and restore KV shaped like a real model through real vaults: GB/s, bytes/token, break-even."""
    from tierkv.bench import runner

    def measure(cfg: Config, console: Console) -> BenchResult:
        from dataclasses import replace

        from tierkv.bench.synthetic import SyntheticSettings, run_synthetic

        settings = SyntheticSettings(
            shape=runner.model_shape(shape),
            lengths=runner.parse_lengths(tokens),
            codecs=runner.parse_codecs(codec),
            repeats=repeats,
            block_tokens=block_tokens,
            batch_bytes=max(1, int(batch_mib * (1 << 20))),
            ssm_every=ssm_every,
            max_seconds=max_seconds,
            prefill=runner.prefill_model(prefill_tps, prefill_at),
            seed=seed,
            decoder=decoder,
            overlap=overlap,
            decode_threads=decode_threads,
        )
        settings.validate()  # before a link is set up for it
        where = runner.vault_settings(vaults, use_config_vaults, state_dir, vault_max_bytes, vault_sync)
        return runner.on_link(
            link,
            where,
            lambda shaped, spec: run_synthetic(cfg, replace(settings, link=spec), shaped, console),
        )

    _run(config, verbose, json_out, measure)


@bench_app.command()
def hf(
    config: ConfigOpt = None,
    shape: Shape = "qwen2.5-0.5b",
    tokens: Lengths = "512,2048",
    codec: Annotated[str, typer.Option(help="Codec of the stored blocks: raw or int8.")] = "raw",
    repeats: Repeats = 2,
    block_tokens: BlockTokens = 16,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    max_seconds: MaxSeconds = 300.0,
    min_speedup: MinSpeedup = None,
    vaults: Vaults = "local",
    use_config_vaults: UseConfigVaults = False,
    state_dir: StateDir = None,
    vault_max_bytes: VaultMaxBytes = "1GiB",
    vault_sync: VaultSync = "durable",
    link: LinkOpt = None,
    seed: Seed = 0,
    overlap: Annotated[
        bool,
        typer.Option(
            "--overlap/--no-overlap",
            help="Cold restores decode each block while the rest arrives (the session's decode_behind).",
        ),
    ] = True,
    json_out: JsonOut = None,
    verbose: Verbose = 0,
) -> None:
    """Prefill vs hot hit vs cold restore TTFT with a random-weight transformers model (needs torch)."""
    from tierkv.bench import runner

    def measure(cfg: Config, console: Console) -> BenchResult:
        from tierkv.bench.hf import HFSettings, run_hf

        codecs = runner.parse_codecs(codec)
        if len(codecs) != 1:
            raise BenchError(f"--codec: hf restores with one codec, got {codec!r}")
        settings = HFSettings(
            shape=runner.model_shape(shape),
            lengths=runner.parse_lengths(tokens),
            repeats=repeats,
            device=device,
            codec=codecs[0],
            block_tokens=block_tokens,
            max_seconds=max_seconds,
            min_speedup=min_speedup,
            seed=seed,
            decode_behind=overlap,
        )
        where = runner.vault_settings(vaults, use_config_vaults, state_dir, vault_max_bytes, vault_sync)
        if link and runner.link_has_round_trip(link):
            raise BenchError("--link: hf takes a rate only (a round trip is waited by bench synthetic)")
        return runner.on_link(link, where, lambda shaped, _: run_hf(cfg, settings, shaped, console))

    _run(config, verbose, json_out, measure)


@bench_app.command()
def engine(
    url: Annotated[
        str, typer.Argument(help="Base URL of an OpenAI-compatible server (vLLM, EXO), e.g. http://gpu:8000.")
    ],
    config: ConfigOpt = None,
    tokens: Lengths = "1k,4k",
    repeats: Repeats = 3,
    model: Annotated[str | None, typer.Option(help="Model name (default: GET /v1/models).")] = None,
    api: Annotated[str, typer.Option(help="auto, completions or chat.")] = "auto",
    evict: Annotated[
        str, typer.Option(help="auto, reset (POST /reset_prefix_cache), flood or none.")
    ] = "auto",
    flood_tokens: Annotated[int, typer.Option(help="Tokens of unrelated prompts to evict with.")] = 65536,
    settle: Annotated[float, typer.Option(help="Seconds for stores to land before eviction.")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 4,
    max_seconds: MaxSeconds = 900.0,
    min_speedup: MinSpeedup = None,
    seed: Seed = 0,
    json_out: JsonOut = None,
    verbose: Verbose = 0,
) -> None:
    """Cold vs restored streamed TTFT of a running engine with the tierkv connector (its vaults, not ours)."""
    from tierkv.bench import runner

    def measure(cfg: Config, console: Console) -> BenchResult:
        from tierkv.bench.engine import EngineSettings, run_engine

        settings = EngineSettings(
            url=url,
            model=model,
            lengths=runner.parse_lengths(tokens),
            repeats=repeats,
            max_tokens=max_new_tokens,
            api=api,
            evict=evict,
            flood_tokens=flood_tokens,
            settle_s=settle,
            max_seconds=max_seconds,
            min_speedup=min_speedup,
            seed=seed,
        )
        return run_engine(settings, console)

    _run(config, verbose, json_out, measure)


@bench_app.command()
def mlx(
    config: ConfigOpt = None,
    tokens: Lengths = "512,2048",
    repeats: Repeats = 2,
    block_tokens: BlockTokens = 16,
    codec: Annotated[str, typer.Option(help="Codec of the stored blocks: raw or int8.")] = "raw",
    layers: Annotated[int, typer.Option(help="Layers of the random llama.")] = 8,
    hidden: Annotated[int, typer.Option(help="Hidden size of the random llama.")] = 512,
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32.")] = "bfloat16",
    sliding_window: Annotated[
        int, typer.Option(help="Every other layer a window of N tokens (0: none).")
    ] = 0,
    vaults: Vaults = "local",
    use_config_vaults: UseConfigVaults = False,
    state_dir: StateDir = None,
    vault_max_bytes: VaultMaxBytes = "1GiB",
    vault_sync: VaultSync = "durable",
    seed: Seed = 0,
    json_out: JsonOut = None,
    verbose: Verbose = 0,
) -> None:
    """Prefill vs hot hit vs cold restore TTFT with a random-weight mlx-lm model (needs tierkv[mlx])."""
    from tierkv.bench import runner
    from tierkv.bench.vaults import measured_on

    def measure(cfg: Config, console: Console) -> BenchResult:
        try:
            from tierkv.bench.mlx import MlxBenchSettings, run_mlx
        except ImportError as exc:
            raise BenchError(f"bench mlx needs mlx and mlx-lm (tierkv's mlx extra): {exc}") from exc
        settings = MlxBenchSettings(
            lengths=runner.parse_lengths(tokens),
            repeats=repeats,
            block_size=block_tokens,
            codec=codec,
            layers=layers,
            hidden=hidden,
            dtype=dtype,
            sliding_window=sliding_window,
            seed=seed,
        )
        where = runner.vault_settings(vaults, use_config_vaults, state_dir, vault_max_bytes, vault_sync)
        return measured_on(cfg, where, need_ssm=True, run=lambda cluster: run_mlx(cluster, settings, console))

    _run(config, verbose, json_out, measure)


@bench_app.command()
def llamacpp(
    config: ConfigOpt = None,
    tokens: Lengths = "512,2048",
    repeats: Repeats = 2,
    block_tokens: BlockTokens = 16,
    layers: Annotated[int, typer.Option(help="Layers of the random llama.")] = 8,
    hidden: Annotated[int, typer.Option(help="Hidden size of the random llama.")] = 512,
    kv: Annotated[
        str, typer.Option(help="KV cache type: f16, q8_0 or q4_0 (V stays f16 without flash attention).")
    ] = "f16",
    flash_attn: Annotated[
        bool, typer.Option("--flash-attn/--no-flash-attn", help="llama.cpp flash attention.")
    ] = True,
    threads: Annotated[int, typer.Option(help="llama.cpp threads.")] = 2,
    vaults: Vaults = "local",
    use_config_vaults: UseConfigVaults = False,
    state_dir: StateDir = None,
    vault_max_bytes: VaultMaxBytes = "1GiB",
    vault_sync: VaultSync = "durable",
    seed: Seed = 0,
    json_out: JsonOut = None,
    verbose: Verbose = 0,
) -> None:
    """Prefill vs hot hit vs cold restore TTFT with a random-weight llama.cpp model (tierkv[llamacpp])."""
    from tierkv.bench import runner
    from tierkv.bench.vaults import measured_on

    def measure(cfg: Config, console: Console) -> BenchResult:
        try:
            from tierkv.bench.llamacpp import KV_TYPES, LlamaBenchSettings, run_llamacpp
        except ImportError as exc:
            raise BenchError(
                f"bench llamacpp needs llama-cpp-python and gguf (tierkv's llamacpp extra): {exc}"
            ) from exc
        if kv not in KV_TYPES:
            raise BenchError(f"--kv: one of {', '.join(KV_TYPES)}, got {kv!r}")
        settings = LlamaBenchSettings(
            lengths=runner.parse_lengths(tokens),
            repeats=repeats,
            block_size=block_tokens,
            layers=layers,
            hidden=hidden,
            kv=kv,
            flash_attn=flash_attn,
            threads=threads,
            seed=seed,
        )
        where = runner.vault_settings(vaults, use_config_vaults, state_dir, vault_max_bytes, vault_sync)
        return measured_on(
            cfg, where, need_ssm=False, run=lambda cluster: run_llamacpp(cluster, settings, console)
        )

    _run(config, verbose, json_out, measure)


@bench_app.command()
def trace(
    trace_file: Annotated[
        str | None, typer.Option("--trace", help="Replay this JSONL trace instead of generating one.")
    ] = None,
    write_trace: Annotated[str | None, typer.Option(help="Save the trace replayed as JSONL.")] = None,
    tenants: Annotated[int, typer.Option(help="Generated: tenants (each its own namespace).")] = 2,
    agents: Annotated[int, typer.Option(help="Generated: agents per tenant.")] = 2,
    sessions: Annotated[int, typer.Option(help="Generated: sessions per agent.")] = 8,
    turns: Annotated[int, typer.Option(help="Generated: most requests per session.")] = 6,
    policies: Annotated[
        str, typer.Option(help="Eviction policies to compare.")
    ] = "lru,adaptive,priority-lru,context",
    capacities: Annotated[
        str, typer.Option(help="Vault budgets as fractions of the trace's working set.")
    ] = "10%,30%,60%",
    block_tokens: BlockTokens = 16,
    shape: Shape = "qwen2.5-0.5b",
    blob_bytes: Annotated[
        str | None, typer.Option(help="Bytes per stored block (default: the shape's KV bytes per block).")
    ] = None,
    prefill_tps: Annotated[
        float,
        typer.Option("--prefill-tokens-per-s", help="Prefill rate that turns saved tokens into seconds."),
    ] = 5000.0,
    protected_cap: Annotated[
        float, typer.Option(help="Share of the capacity protected classes may pin (the vault's cap).")
    ] = 0.5,
    min_turnover: Annotated[
        int, typer.Option(help="The context vaults' [retention.weights] min_turnover (store events; 0: off).")
    ] = 0,
    workload: Annotated[
        str,
        typer.Option(help="Generated trace: agent (tagged, multi-tenant), or hash ids: chat, docs, agents."),
    ] = "agent",
    requests: Annotated[int, typer.Option(help="Generated hash-id shapes: requests in the trace.")] = 4000,
    trace_format: Annotated[
        str, typer.Option("--format", help="Trace lines: auto (by their fields), tierkv or hash-ids.")
    ] = "auto",
    trace_block_tokens: Annotated[
        str,
        typer.Option(
            help="Tokens per id of a hash-id trace, its replay's block size: auto (found from the lines; "
            "Mooncake's 512, Bailian's 16) or N. Generated hash-id shapes: N, auto is 512."
        ),
    ] = "auto",
    timestamp_unit: Annotated[
        str,
        typer.Option(help="Hash-id timestamps: auto (seconds for Bailian's fields, else ms), ms or s."),
    ] = "auto",
    max_requests: Annotated[
        int | None, typer.Option(help="Read only the trace file's first N requests (bounds memory and time).")
    ] = None,
    keep_order: Annotated[
        bool, typer.Option(help="Replay in the file's order even where its timestamps are out of order.")
    ] = False,
    speedup: Annotated[
        float, typer.Option(help="Replay timestamps at this many times their pace (0: back to back).")
    ] = 0.0,
    in_process: Annotated[
        bool, typer.Option(help="Replay lru and adaptive by their in-process twins instead of vaults.")
    ] = False,
    lease_ms: Annotated[
        int, typer.Option(help="Lookup lease, as the vLLM connector asks (0: none; at most 10000).")
    ] = 2000,
    chart: Annotated[
        str | None, typer.Option(help="Chart PNG or SVG (default: next to --json FILE, as .png).")
    ] = None,
    max_seconds: Annotated[
        float, typer.Option(help="Time limit of each run (policy at a capacity); a run past it is skipped.")
    ] = 1800.0,
    state_dir: StateDir = None,
    vault_sync: VaultSync = "fast",
    prefetch: Annotated[
        str | None,
        typer.Option(help="Also replay with and without predictive prefetch, with a buffer of this size."),
    ] = None,
    prefetch_gap_ms: Annotated[
        float, typer.Option(help="Prefetch comparison: pause between requests (the engine's decode time).")
    ] = 50.0,
    prefetch_only: Annotated[
        bool, typer.Option(help="Only the prefetch comparison (no policy runs).")
    ] = False,
    seed: Seed = 0,
    json_out: JsonOut = None,
    verbose: Verbose = 0,
) -> None:
    """Replay a trace (a file in tierkv's or the hash-id format, or generated) through vaults per eviction
    policy and capacity, as an engine talks to them, beside the reference LRU and the offline optimum."""

    def measure(cfg: Config, console: Console) -> BenchResult:
        from tierkv.bench.trace import TraceSpec
        from tierkv.bench.trace.cli_args import trace_settings
        from tierkv.bench.trace.run import run_trace

        settings = trace_settings(
            spec=TraceSpec(seed=seed, tenants=tenants, agents=agents, sessions=sessions, turns=turns),
            trace_file=trace_file,
            write_trace=write_trace,
            policies=policies,
            capacities=capacities,
            block_tokens=block_tokens,
            shape=shape,
            blob_bytes=blob_bytes,
            prefill_tps=prefill_tps,
            protected_cap=protected_cap,
            chart=chart,
            json_out=json_out,
            max_seconds=max_seconds,
            state_dir=state_dir,
            vault_sync=vault_sync,
            prefetch=prefetch,
            prefetch_gap_ms=prefetch_gap_ms,
            prefetch_only=prefetch_only,
            min_turnover=min_turnover,
            workload=workload,
            requests=requests,
            trace_block_tokens=trace_block_tokens,
            speedup=speedup,
            in_process=in_process,
            lease_ms=lease_ms,
            trace_format=trace_format,
            timestamp_unit=timestamp_unit,
            max_requests=max_requests,
            keep_order=keep_order,
        )
        return run_trace(settings, console)

    _run(None, verbose, json_out, measure)


__all__ = ["BenchGroup", "bench_app", "deprecation_note", "legacy_args"]
