"""``tierkv bench --hf``: prefill vs hot hit vs cold restore, timed to the first token, on a real model.

A random-weight transformers model of the chosen shape (no download: the FLOPs and the KV bytes are the
real model's, the words are noise) runs through :class:`~tierkv.connectors.hf.TieredSession` against
vaults. For each prompt length and repeat, a fresh prompt is generated three times, one new token each:

1. **prefill** — nothing is cached: the whole prompt is computed;
2. **hot hit** — the same prompt again, its KV from the session's in-process hot tier;
3. **cold restore** — after the hot tier has been shipped to the vaults and emptied (``persist``), the
   same prompt again: its KV comes back from the vaults (one lookup, one batched get, verify, decode).

TTFT is the session's own measurement, from the call to the first generated token. The prefill times
at two or more lengths give the ``a·n + b·n²`` prefill model, the restore times the restore line, and
:mod:`.breakeven` the length where they cross.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tierkv.bench import BenchError
from tierkv.bench.breakeven import BreakEven, PrefillModel, RestoreModel, break_even, net_of
from tierkv.bench.record import RunMeta, median
from tierkv.bench.shapes import ModelShape, hf_arch
from tierkv.bench.vaults import VaultSettings, counter_delta, open_vaults
from tierkv.codec import CODECS
from tierkv.config import Config

logger = logging.getLogger(__name__)

_TORCH_DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class HFSettings:
    shape: ModelShape
    lengths: tuple[int, ...] = (512, 2048)
    repeats: int = 2
    device: str = "cpu"
    codec: str = "raw"
    block_tokens: int = 16
    max_seconds: float = 300.0
    min_speedup: float | None = None
    seed: int = 0

    def validate(self) -> None:
        if not self.lengths or min(self.lengths) < 2 * self.block_tokens:
            raise BenchError(
                f"--hf prompt lengths must be at least two blocks ({2 * self.block_tokens} tokens)"
            )
        if self.codec not in CODECS:
            raise BenchError(f"unknown codec {self.codec!r}; expected one of {sorted(CODECS)}")
        if self.repeats < 1 or self.block_tokens < 1 or self.max_seconds <= 0:
            raise BenchError("repeats, block tokens and --max-seconds must be positive")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise BenchError(f"--device must be cpu or cuda, got {self.device!r}")
        try:
            hf_arch(self.shape)
        except ValueError as exc:
            raise BenchError(str(exc)) from exc

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": dataclasses.asdict(self.shape),
            "architecture": dataclasses.asdict(hf_arch(self.shape)),
            "lengths": list(self.lengths),
            "repeats": self.repeats,
            "device": self.device,
            "codec": self.codec,
            "block_tokens": self.block_tokens,
            "max_seconds": self.max_seconds,
            "min_speedup": self.min_speedup,
            "seed": self.seed,
        }


@dataclasses.dataclass
class HFRow:
    """One prompt length over its repeats; times in seconds, one entry per repeat."""

    tokens: int
    prefill_ttft_s: list[float] = dataclasses.field(default_factory=list)
    hot_ttft_s: list[float] = dataclasses.field(default_factory=list)
    restore_ttft_s: list[float] = dataclasses.field(default_factory=list)
    network_s: list[float] = dataclasses.field(default_factory=list)
    codec_s: list[float] = dataclasses.field(default_factory=list)
    inject_s: list[float] = dataclasses.field(default_factory=list)
    hot_sources: list[str] = dataclasses.field(default_factory=list)
    restore_sources: list[str] = dataclasses.field(default_factory=list)
    restored_tokens: int = 0
    bytes_fetched: int = 0

    def figures(self) -> dict[str, Any]:
        prefill = median(self.prefill_ttft_s)
        restore = median(self.restore_ttft_s)
        restore_io = median([sum(t) for t in zip(self.network_s, self.codec_s, self.inject_s, strict=True)])
        return {
            "prefill_ttft_s": prefill,
            "hot_ttft_s": median(self.hot_ttft_s),
            "restore_ttft_s": restore,
            "prefill_tokens_per_s": self.tokens / prefill if prefill else None,
            "speedup": prefill / restore if prefill and restore else None,
            "hot_speedup": _ratio(prefill, median(self.hot_ttft_s)),
            "network_s": median(self.network_s),
            "codec_s": median(self.codec_s),
            "inject_s": median(self.inject_s),
            "restore_wire_gbps": _ratio(self.bytes_fetched / 1e9, restore_io),
        }

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), **self.figures()}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


@dataclasses.dataclass
class HFResult:
    meta: RunMeta
    settings: HFSettings
    model_desc: str = ""
    rows: list[HFRow] = dataclasses.field(default_factory=list)
    vaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    breakeven: dict[str, BreakEven] = dataclasses.field(default_factory=dict)
    prefill_model: PrefillModel | None = None
    restore_model: RestoreModel | None = None
    truncated: bool = False
    warnings: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    verdict: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors and bool(self.rows)

    def document(self) -> dict[str, Any]:
        return {
            **self.meta.as_dict(),
            "ok": self.ok,
            "verdict": self.verdict,
            "warnings": self.warnings,
            "errors": self.errors,
            "truncated": self.truncated,
            "model": self.model_desc,
            "vaults": self.vaults,
            "results": [r.as_dict() for r in self.rows],
            "prefill_model": None if self.prefill_model is None else self.prefill_model.as_dict(),
            "restore_model": None if self.restore_model is None else self.restore_model.as_dict(),
            "breakeven": {k: b.as_dict() for k, b in self.breakeven.items()},
        }


def build_model(shape: ModelShape, device: str) -> tuple[Any, str]:
    """A random-weight causal LM with the shape's architecture, on ``device``, in the shape's dtype."""
    import torch
    import transformers as tf

    if shape.dtype not in _TORCH_DTYPES:
        raise BenchError(f"unsupported dtype {shape.dtype}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BenchError("--device cuda: torch sees no CUDA device here")
    arch = hf_arch(shape)
    common: dict[str, Any] = {
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": arch.attention_heads,
        "num_key_value_heads": shape.kv_heads,
        "vocab_size": arch.vocab_size,
        "tie_word_embeddings": arch.tie_embeddings,
        "max_position_embeddings": 131072,
    }
    cfg: Any
    if arch.family == "qwen2":
        if arch.hidden_size != arch.attention_heads * shape.head_dim:
            raise BenchError(f"{shape.name}: qwen2 needs hidden_size = heads x head_dim")
        cfg = tf.Qwen2Config(**common)
    else:
        cfg = tf.LlamaConfig(head_dim=shape.head_dim, **common)
    dtype = getattr(torch, shape.dtype)
    auto: Any = tf.AutoModelForCausalLM
    with torch.device(device):
        model = auto.from_config(cfg, dtype=dtype)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    desc = f"{shape.name} ({arch.family}, {params / 1e6:,.0f}M parameters, {shape.dtype})"
    return model, desc


def run_hf(config: Config, settings: HFSettings, vault_settings: VaultSettings, console: Console) -> HFResult:
    settings.validate()
    started = time.monotonic()
    meta = RunMeta("hf", {**settings.as_dict(), "vaults": dataclasses.asdict(vault_settings)})
    result = HFResult(meta, settings)
    import torch

    from tierkv.connectors.hf import TieredSession

    torch.manual_seed(settings.seed)
    with console.status(f"building a random-weight {settings.shape.name} on {settings.device} ..."):
        model, result.model_desc = build_model(settings.shape, settings.device)
    lengths = sorted(set(settings.lengths))
    kv_bytes = max(lengths) * settings.shape.kv_bytes_per_token
    budget = max(vault_settings.max_bytes, 4 * kv_bytes * settings.repeats + (64 << 20))
    if vault_settings.mode != "config":
        vault_settings = dataclasses.replace(vault_settings, max_bytes=budget)
    with open_vaults(config, vault_settings, need_ssm=False) as vaults:
        before = vaults.stats()
        result.vaults = {**vaults.describe(), "before": before}
        session = TieredSession(
            model,
            vaults.cluster,
            codec=settings.codec,
            block_size=settings.block_tokens,
            hot_bytes=max(1 << 30, 4 * kv_bytes),
            model_id=f"tierkv-bench/{settings.shape.name}/{time.time_ns()}",
        )
        try:
            gen = torch.Generator().manual_seed(settings.seed)
            vocab = hf_arch(settings.shape).vocab_size
            with console.status("warming up ..."):
                warm = torch.randint(0, vocab, (1, 2 * settings.block_tokens + 1), generator=gen)
                session.generate(warm, max_new_tokens=1, do_sample=False)
                session.persist(timeout=60)
            _measure(session, settings, result, lengths, gen, vocab, started, console)
        finally:
            session.close(timeout=60)
        after = vaults.stats()
        result.vaults.update(after=after, delta=counter_delta(before, after))
        result.warnings.extend(vaults.warnings)
    _conclude(result)
    meta.finish(time.monotonic() - started)
    return result


def _measure(
    session: Any,
    settings: HFSettings,
    result: HFResult,
    lengths: list[int],
    gen: Any,
    vocab: int,
    started: float,
    console: Console,
) -> None:
    import torch

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("hf", total=len(lengths) * settings.repeats)
        for n in lengths:
            row = HFRow(n)
            for rep in range(settings.repeats):
                if time.monotonic() - started > settings.max_seconds:
                    result.truncated = True
                    break
                progress.update(task, description=f"{n:,} tokens ({rep + 1}/{settings.repeats})")
                ids = torch.randint(0, vocab, (1, n), generator=gen)
                session.generate(ids, max_new_tokens=1, do_sample=False)
                cold = session.last_stats
                if cold.restored_tokens:
                    result.errors.append(
                        f"{n} tokens: a fresh prompt found {cold.restored_tokens} cached tokens"
                    )
                row.prefill_ttft_s.append(cold.ttft_s)
                session.generate(ids, max_new_tokens=1, do_sample=False)
                hot = session.last_stats
                row.hot_ttft_s.append(hot.ttft_s)
                row.hot_sources.append(hot.source)
                if not session.persist(timeout=120):
                    result.errors.append(f"{n} tokens: storing to the vaults did not finish within 120 s")
                session.generate(ids, max_new_tokens=1, do_sample=False)
                restored = session.last_stats
                row.restore_ttft_s.append(restored.ttft_s)
                row.restore_sources.append(restored.source)
                row.network_s.append(restored.network_s)
                row.codec_s.append(restored.codec_s)
                row.inject_s.append(restored.inject_s)
                row.restored_tokens = restored.cold_hits
                row.bytes_fetched = restored.bytes_fetched
                if restored.cold_hits == 0:
                    result.errors.append(
                        f"{n} tokens: the restore after persist found nothing in the vaults (source "
                        f"{restored.source!r}, {restored.rejected_blobs} blobs rejected)"
                    )
                session.persist(timeout=120)
                progress.advance(task)
            if row.prefill_ttft_s:
                result.rows.append(row)
            if result.truncated:
                result.warnings.append(f"stopped at --max-seconds {settings.max_seconds:g}")
                break


def _conclude(result: HFResult) -> None:
    rows = [r for r in result.rows if r.restore_ttft_s]
    if not rows:
        result.verdict = "FAIL: " + (result.errors[0] if result.errors else "no measurement completed")
        return
    common = median([t for r in rows for t in r.hot_ttft_s]) or 0.0
    result.prefill_model = PrefillModel.fit(
        net_of([(r.tokens, t) for r in rows for t in r.prefill_ttft_s], common)
    )
    bpt = rows[-1].bytes_fetched / rows[-1].restored_tokens if rows[-1].restored_tokens else None
    result.restore_model = RestoreModel.fit(
        net_of([(r.tokens, t) for r in rows for t in r.restore_ttft_s], common),
        bytes_per_token=bpt,
        what="restore TTFT",
    )
    name = f"cold restore ({result.settings.codec})"
    result.breakeven[name] = break_even(result.prefill_model, result.restore_model, common_s=common)
    floor = result.settings.min_speedup
    for row in rows:
        speedup = row.figures()["speedup"] or 0.0
        if floor is not None and speedup < floor:
            result.errors.append(
                f"{row.tokens:,} tokens: speedup {speedup:.2f}× is below --min-speedup {floor:g}"
            )
    if not result.ok:
        result.verdict = "FAIL: " + result.errors[0]
        return
    top = rows[-1].figures()
    be = result.breakeven[name]
    where = "never" if be.tokens is None else f"above {be.tokens:,} tokens"
    result.verdict = (
        f"On {result.settings.device}, a cold restore of {rows[-1].tokens:,} tokens gives the first token in "
        f"{top['restore_ttft_s']:.3f} s instead of {top['prefill_ttft_s']:.2f} s "
        f"({top['speedup']:.1f}×); restoring beats recomputing {where}."
    )


__all__ = ["HFResult", "HFRow", "HFSettings", "build_model", "run_hf"]
