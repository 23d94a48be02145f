"""``tierkv bench hf``: prefill vs hot hit vs cold restore, timed to the first token, on a real model.

A random-weight transformers model of the chosen shape (no download: the FLOPs and the KV bytes are the
real model's, the words are noise) runs through :class:`~tierkv.connectors.hf.TieredSession` against
vaults. For each prompt length, ``repeats`` fresh prompts are generated, one new token each:

1. **prefill** — nothing is cached: the whole prompt is computed;
2. **hot hit** — the same prompt again, its KV from the session's in-process hot tier;
3. then every prompt of the length is shipped to the vaults (``persist``), so the vaults' own write
   work is done before any restore is timed, as in real use where a prefix returns long after it left;
4. **cold restore** — each prompt again with the hot tier emptied: its KV comes back from the vaults
   (one lookup, one batched get, verify, decode, inject into the cache);
5. **data plane** — the restore's BatchGet replayed bare (same keys, same bytes, no decode), so the
   restore can be compared with what moving its bytes costs on this data plane, in the same run.

TTFT is the session's own measurement, from the call to the first generated token; the restore's own
time splits into network (lookup and gets), codec (verify and decode) and cache injection. The prefill
times at two or more lengths give the ``a·n + b·n²`` prefill model, the restore times the restore
line, and :mod:`.breakeven` the length where they cross. With a lossy codec the run ends with
:func:`~tierkv.bench.quality.restore_agreement` for ``raw`` and that codec.

The run checks itself against the targets tiering is built for (reported, never failing the run):
a cold restore at least :data:`SPEEDUP_TARGET` times faster than prefill at :data:`SPEEDUP_AT` tokens,
a restore within :data:`DATAPLANE_TARGET` times the time its bytes need on the data plane, and
restore throughput (tokens/s) that stays flat as prompts grow, i.e. restore time linear in tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tierkv.bench import BenchError
from tierkv.bench.breakeven import RestoreModel, ttft_break_even
from tierkv.bench.common import (
    Bar,
    BenchRun,
    Deadline,
    check_codecs,
    check_sweep,
    progress_bar,
    ratio,
    settings_document,
)
from tierkv.bench.record import RunMeta, median
from tierkv.bench.shapes import ModelShape, hf_arch
from tierkv.bench.vaults import VaultSettings, watched_vaults
from tierkv.client.cluster import KV_COLD, Cluster
from tierkv.codec import Buffer
from tierkv.config import Config
from tierkv.records import HotChain, PutResult, Successor
from tierkv.retention import BlockMeta
from tierkv.tiering.storage import BlobSink

if TYPE_CHECKING:
    from tierkv.connectors.hf import GenerationStats, TieredSession

logger = logging.getLogger(__name__)

SPEEDUP_AT = 4096
SPEEDUP_TARGET = 20.0
DATAPLANE_TARGET = 2.0
AGREEMENT_TOKENS = 64
REPLAYS = 3
STORE_TIMEOUT_S = 120.0
_TORCH_DTYPES = ("bfloat16", "float16", "float32")
_PARTS = ("plan", "network", "codec", "inject")


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
    decode_behind: bool = True

    def validate(self) -> None:
        check_sweep(
            self,
            min_length=2 * self.block_tokens,
            what="two blocks",
            positive={"--block-tokens": self.block_tokens},
        )
        check_codecs([self.codec])
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise BenchError(f"--device must be cpu or cuda, got {self.device!r}")
        try:
            hf_arch(self.shape)
        except ValueError as exc:
            raise BenchError(str(exc)) from exc

    def as_dict(self) -> dict[str, Any]:
        return {**settings_document(self), "architecture": dataclasses.asdict(hf_arch(self.shape))}


@dataclasses.dataclass
class HFRow:
    """One prompt length over its repeats; times in seconds, one entry per repeat.

    ``restore_s`` is the restore itself (``plan_s + network_s + codec_s + inject_s``); the rest of the
    cold-restore TTFT is the forward pass over the prompt tokens after the last restored block
    (``compute_s`` in the figures). ``dataplane_s`` times the restore's BatchGet replayed bare
    (:data:`REPLAYS` times per restore), each moving ``dataplane_bytes``.
    """

    tokens: int
    prefill_ttft_s: list[float] = dataclasses.field(default_factory=list)
    hot_ttft_s: list[float] = dataclasses.field(default_factory=list)
    restore_ttft_s: list[float] = dataclasses.field(default_factory=list)
    restore_s: list[float] = dataclasses.field(default_factory=list)
    plan_s: list[float] = dataclasses.field(default_factory=list)
    network_s: list[float] = dataclasses.field(default_factory=list)
    codec_s: list[float] = dataclasses.field(default_factory=list)
    inject_s: list[float] = dataclasses.field(default_factory=list)
    dataplane_s: list[float] = dataclasses.field(default_factory=list)
    hot_sources: list[str] = dataclasses.field(default_factory=list)
    restore_sources: list[str] = dataclasses.field(default_factory=list)
    restored_tokens: int = 0
    bytes_fetched: int = 0
    dataplane_bytes: int = 0

    def add_prefill(self, prefill: GenerationStats, hot: GenerationStats) -> None:
        self.prefill_ttft_s.append(prefill.ttft_s)
        self.hot_ttft_s.append(hot.ttft_s)
        self.hot_sources.append(hot.source)

    def add_restore(self, restored: GenerationStats, replays: Sequence[tuple[float, int]]) -> None:
        self.restore_ttft_s.append(restored.ttft_s)
        self.restore_sources.append(restored.source)
        self.restore_s.append(restored.restore_s)
        for part in _PARTS:
            getattr(self, f"{part}_s").append(getattr(restored, f"{part}_s"))
        self.restored_tokens = restored.cold_hits
        self.bytes_fetched = restored.bytes_fetched
        for seconds, nbytes in replays:
            self.dataplane_s.append(seconds)
            self.dataplane_bytes = nbytes

    def shares(self) -> dict[str, float | None]:
        """Fractions of the restore time (all repeats together) spent in each part; they sum to 1."""
        total = sum(self.restore_s)
        return {f"{part}_share": ratio(sum(getattr(self, f"{part}_s")), total) for part in _PARTS}

    def figures(self) -> dict[str, Any]:
        prefill = median(self.prefill_ttft_s)
        hot = median(self.hot_ttft_s)
        restore_ttft = median(self.restore_ttft_s)
        restore = median(self.restore_s)
        dataplane_bps = ratio(self.dataplane_bytes, median(self.dataplane_s))
        bytes_time = ratio(self.bytes_fetched, dataplane_bps)
        return {
            "prefill_ttft_s": prefill,
            "hot_ttft_s": hot,
            "restore_ttft_s": restore_ttft,
            "prefill_tokens_per_s": ratio(self.tokens, prefill),
            "speedup": ratio(prefill, restore_ttft),
            "hot_speedup": ratio(prefill, hot),
            "restore_s": restore,
            "compute_s": median([t - r for t, r in zip(self.restore_ttft_s, self.restore_s, strict=True)]),
            **{f"{part}_s": median(getattr(self, f"{part}_s")) for part in _PARTS},
            "dataplane_s": median(self.dataplane_s),
            **self.shares(),
            "restore_tokens_per_s": ratio(self.restored_tokens, restore),
            "restore_wire_gbps": _gbps(ratio(self.bytes_fetched, restore)),
            "dataplane_gbps": _gbps(dataplane_bps),
            "dataplane_bytes_s": bytes_time,
            "restore_vs_dataplane": ratio(restore, bytes_time),
        }

    def as_dict(self) -> dict[str, Any]:
        """Counts, the per-repeat lists under ``runs``, and the figures (medians under the lists' names)."""
        fields = dataclasses.asdict(self)
        runs = {k: fields.pop(k) for k in list(fields) if k.endswith("_s")}
        return {**fields, "runs": runs, **self.figures()}


def _gbps(bytes_per_s: float | None) -> float | None:
    return None if bytes_per_s is None else bytes_per_s / 1e9


@dataclasses.dataclass
class Target:
    """One of the goals tiering is built for, as this run measured it (``met`` None: for the reader)."""

    name: str
    goal: str
    measured: str
    value: Any = None
    met: bool | None = None


@dataclasses.dataclass
class HFResult(BenchRun):
    settings: HFSettings
    model_desc: str = ""
    rows: list[HFRow] = dataclasses.field(default_factory=list)
    vaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    targets: list[Target] = dataclasses.field(default_factory=list)
    quality: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors and bool(self.rows)

    def figures_document(self) -> dict[str, Any]:
        be = next(iter(self.breakeven.values()), None)
        return {
            "model": self.model_desc,
            "vaults": self.vaults,
            "results": [r.as_dict() for r in self.rows],
            "targets": [dataclasses.asdict(t) for t in self.targets],
            "quality": self.quality,
            "prefill_model": None if be is None else be.prefill.as_dict(),
            "restore_model": None if be is None else be.restore.as_dict(),
        }


class RecordingCluster:
    """The session's cluster, seen through: it remembers the keys of the latest KV BatchGet and every
    key stored.

    The latest BatchGet is what :meth:`replay` times again, bare, for the data-plane figure; the stored
    keys are what :meth:`delete_stored` removes when the run ends, so configured vaults keep nothing.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.last_get: tuple[bytes, list[bytes]] | None = None
        self.stored: dict[tuple[bytes, str], set[bytes]] = defaultdict(set)

    def put(
        self,
        namespace: bytes,
        items: Mapping[bytes, bytes],
        role: str = KV_COLD,
        *,
        meta: Mapping[bytes, BlockMeta] | None = None,
    ) -> PutResult:
        self.stored[namespace, role].update(items)
        return self.cluster.put(namespace, items, role=role, meta=meta)

    def get(self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD) -> list[bytes | None]:
        return self.cluster.get(namespace, keys, role=role)

    def get_buffers(
        self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD, *, timeout: float | None = None
    ) -> list[Buffer | None]:
        if role == KV_COLD:
            self.last_get = (namespace, list(keys))
        return self.cluster.get_buffers(namespace, keys, role=role, timeout=timeout)

    def get_each(
        self, namespace: bytes, keys: Sequence[bytes], on_blob: BlobSink, role: str = KV_COLD
    ) -> list[int | None]:
        if role == KV_COLD:
            self.last_get = (namespace, list(keys))
        return self.cluster.get_each(namespace, keys, on_blob, role=role)

    def prefix_lookup(
        self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD, *, lease_ms: int = 0
    ) -> int:
        return self.cluster.prefix_lookup(namespace, keys, role=role, lease_ms=lease_ms)

    def delete(self, namespace: bytes, keys: Sequence[bytes], role: str = KV_COLD) -> int:
        self.stored[namespace, role].difference_update(keys)
        return self.cluster.delete(namespace, keys, role=role)

    def successors(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        role: str = KV_COLD,
        *,
        max_bytes: int = 0,
        max_keys: int = 0,
        timeout: float | None = None,
    ) -> list[Successor]:
        return self.cluster.successors(
            namespace, keys, role, max_bytes=max_bytes, max_keys=max_keys, timeout=timeout
        )

    def hottest(
        self, namespace: bytes, *, limit: int = 0, tenant: str = "", role: str = KV_COLD
    ) -> list[HotChain]:
        return self.cluster.hottest(namespace, limit=limit, tenant=tenant, role=role)

    def close(self) -> None:
        """Nothing: the run's vault set owns the cluster and closes it after :meth:`delete_stored`."""

    def replay(self, times: int) -> list[tuple[float, int]]:
        """Seconds and bytes of the latest KV BatchGet done again ``times`` times with nothing around it
        (none when the restore made no BatchGet)."""
        if self.last_get is None:
            return []
        namespace, keys = self.last_get
        runs = []
        for _ in range(times):
            start = time.perf_counter()
            blobs = self.cluster.get_buffers(namespace, keys, role=KV_COLD)
            runs.append((time.perf_counter() - start, sum(len(b) for b in blobs if b is not None)))
        return runs

    def delete_stored(self) -> None:
        for (namespace, role), keys in self.stored.items():
            self.cluster.delete(namespace, sorted(keys), role=role)
        self.stored.clear()


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
    deadline = Deadline(settings.max_seconds)
    meta = RunMeta("hf", {**settings.as_dict(), "vaults": dataclasses.asdict(vault_settings)})
    result = HFResult(meta, settings)
    import torch

    from tierkv.bench.quality import random_prompt
    from tierkv.connectors.hf import TieredSession

    torch.manual_seed(settings.seed)
    with console.status(f"building a random-weight {settings.shape.name} on {settings.device} ..."):
        model, result.model_desc = build_model(settings.shape, settings.device)
    lengths = sorted(set(settings.lengths))
    kv_bytes = max(lengths) * settings.shape.kv_bytes_per_token
    budget = 4 * kv_bytes * (settings.repeats + 1) + (64 << 20)
    model_id = f"tierkv-bench/{settings.shape.name}/{time.time_ns()}"
    with watched_vaults(
        config,
        vault_settings.at_least(budget),
        need_ssm=False,
        record=result.vaults,
        warnings=result.warnings,
    ) as vaults:
        cluster = RecordingCluster(vaults.cluster)
        session = TieredSession(
            model,
            cluster,
            codec=settings.codec,
            block_size=settings.block_tokens,
            hot_bytes=max(1 << 30, 4 * kv_bytes),
            model_id=model_id,
            decode_behind=settings.decode_behind,
        )
        vocab = hf_arch(settings.shape).vocab_size
        draw = functools.partial(
            random_prompt, vocab=vocab, generator=torch.Generator().manual_seed(settings.seed)
        )
        try:
            with console.status("warming up ..."):
                _warm_up(session, draw(2 * settings.block_tokens + 1))
            with progress_bar(console, len(lengths) * settings.repeats) as bar:
                for n in lengths:
                    row = _measure_length(session, cluster, n, draw, result, deadline, bar)
                    if row.prefill_ttft_s:
                        result.rows.append(row)
                    if result.truncated:
                        result.warnings.append(deadline.note())
                        break
            if settings.codec != "raw" and result.rows and not result.out_of_time(deadline):
                _agreement(model, cluster, settings, lengths[0], f"{model_id}/agreement", result, console)
        finally:
            session.close(persist=False, timeout=60)
            cluster.delete_stored()
    _conclude(result)
    result.finish(deadline)
    return result


def _generate(session: TieredSession, ids: Any) -> GenerationStats:
    session.generate(ids, max_new_tokens=1, do_sample=False)
    return session.last_stats


def _warm_up(session: TieredSession, ids: Any) -> None:
    """Prefill, store and restore a short prompt once, so no path is first used inside a measurement."""
    _generate(session, ids)
    session.persist(timeout=STORE_TIMEOUT_S)
    _generate(session, ids)
    session.persist(timeout=STORE_TIMEOUT_S)


def _measure_length(
    session: TieredSession,
    cluster: RecordingCluster,
    n: int,
    draw: Callable[[int], Any],
    result: HFResult,
    deadline: Deadline,
    bar: Bar,
) -> HFRow:
    """Prefill and hot hit for each fresh prompt, ship them all, then restore each from the vaults."""
    repeats = result.settings.repeats
    row = HFRow(n)
    prompts: list[Any] = []
    for rep in range(repeats):
        if result.out_of_time(deadline):
            break
        bar.label(f"{n:,} tokens ({rep + 1}/{repeats}): prefill, hot hit")
        ids = draw(n)
        prefill = _generate(session, ids)
        if prefill.restored_tokens:
            result.errors.append(
                f"{n:,} tokens: a fresh prompt found {prefill.restored_tokens} cached tokens"
            )
        row.add_prefill(prefill, _generate(session, ids))
        prompts.append(ids)
    if prompts and not session.persist(timeout=STORE_TIMEOUT_S):
        result.errors.append(
            f"{n:,} tokens: storing to the vaults did not finish within {STORE_TIMEOUT_S:g} s"
        )
    for rep, ids in enumerate(prompts):
        bar.label(f"{n:,} tokens ({rep + 1}/{len(prompts)}): cold restore")
        session.hot.clear()
        cluster.last_get = None
        restored = _generate(session, ids)
        row.add_restore(restored, cluster.replay(REPLAYS))
        if restored.cold_hits == 0:
            result.errors.append(
                f"{n:,} tokens: the restore after persist found nothing in the vaults (source "
                f"{restored.source!r}, {restored.rejected_blobs} blobs rejected)"
            )
        bar.advance()
    return row


def _agreement(
    model: Any,
    cluster: RecordingCluster,
    settings: HFSettings,
    prompt_len: int,
    model_id: str,
    result: HFResult,
    console: Console,
) -> None:
    """Restore quality of the run's codec, with ``raw`` as the model's own noise floor beside it."""
    from tierkv.bench.quality import restore_agreement

    for codec in ("raw", settings.codec):
        with console.status(f"restore quality: {codec}, {AGREEMENT_TOKENS} greedy tokens ..."):
            agreement = restore_agreement(
                model,
                cluster,
                codec=codec,
                prompt_len=prompt_len,
                new_tokens=AGREEMENT_TOKENS,
                block_size=settings.block_tokens,
                seed=settings.seed + 1,
                model_id=model_id,
            )
        result.quality[codec] = dataclasses.asdict(agreement)


def _conclude(result: HFResult) -> None:
    rows = [r for r in result.rows if r.restore_ttft_s]
    if not rows:
        result.verdict = result.failure("no measurement completed")
        return
    s = result.settings
    common = median([t for r in rows for t in r.hot_ttft_s]) or 0.0
    top = rows[-1]
    name = f"cold restore ({s.codec})"
    result.breakeven[name] = ttft_break_even(
        [(r.tokens, t) for r in rows for t in r.prefill_ttft_s],
        [(r.tokens, t) for r in rows for t in r.restore_ttft_s],
        common,
        bytes_per_token=ratio(top.bytes_fetched, top.restored_tokens),
        what="restore TTFT",
    )
    for row in rows:
        result.check_speedup(row.tokens, row.figures()["speedup"], s.min_speedup)
    result.targets = targets(rows)
    if not result.ok:
        result.verdict = result.failure("no measurement completed")
        return
    f = top.figures()
    be = result.breakeven[name]
    where = "never" if be.tokens is None else f"above {be.tokens:,} tokens"
    result.verdict = (
        f"On {s.device}, a cold restore of {top.tokens:,} tokens gives the first token in "
        f"{f['restore_ttft_s']:.3f} s instead of {f['prefill_ttft_s']:.2f} s "
        f"({f['speedup']:.1f}×); restoring beats recomputing {where}."
    )


def targets(rows: Sequence[HFRow]) -> list[Target]:
    """The three checks of the module docstring, from the measured rows."""
    figures = {r.tokens: r.figures() for r in rows}
    speedup = figures.get(SPEEDUP_AT, {}).get("speedup")
    speed = Target(
        "speedup_at_4k",
        f"cold restore ≥ {SPEEDUP_TARGET:g}× faster than prefill at {SPEEDUP_AT:,} tokens",
        f"{speedup:.1f}×" if speedup is not None else f"not measured (add {SPEEDUP_AT} to --tokens)",
        speedup,
        None if speedup is None else speedup >= SPEEDUP_TARGET,
    )
    ratios = {
        n: f["restore_vs_dataplane"] for n, f in figures.items() if f["restore_vs_dataplane"] is not None
    }
    if ratios:
        worst = max(ratios, key=lambda n: ratios[n])
        gbps = figures[worst]["dataplane_gbps"]
        measured = f"worst {ratios[worst]:.2f}× at {worst:,} tokens (data plane {gbps:.2f} GB/s)"
    else:
        worst, measured = 0, "not measured"
    plane = Target(
        "restore_vs_dataplane",
        f"restore ≤ {DATAPLANE_TARGET:g}× the time its bytes need on the data plane",
        measured,
        ratios,
        ratios[worst] <= DATAPLANE_TARGET if ratios else None,
    )
    rates = {n: f["restore_tokens_per_s"] for n, f in figures.items() if f["restore_tokens_per_s"]}
    measured = (
        ", ".join(f"{n:,}: {v:,.0f}" for n, v in rates.items()) + " tokens/s" if rates else "not measured"
    )
    points = [(r.restored_tokens, t) for r in rows if r.restored_tokens for t in r.restore_s if t > 0]
    if len({n for n, _ in points}) >= 2:
        line = RestoreModel.fit(points, what="restores")
        measured += f"; fit {line.fixed_s * 1000:.1f} ms + n / {line.tokens_per_s:,.0f} tokens/s"
    linear = Target(
        "restore_linear",
        "restore time linear in tokens (a fixed cost + tokens / a flat rate)",
        measured,
        rates,
    )
    return [speed, plane, linear]


__all__ = [
    "DATAPLANE_TARGET",
    "SPEEDUP_AT",
    "SPEEDUP_TARGET",
    "HFResult",
    "HFRow",
    "HFSettings",
    "RecordingCluster",
    "Target",
    "build_model",
    "run_hf",
    "targets",
]
