"""Benchmark hooks for ``tierkv bench --hf``: time to first token with and without tierkv.

:func:`run_hf_bench` builds a random-weight model shaped like Qwen2.5-0.5B (no download) and measures,
per prompt length, the TTFT of a full prefill, of a hot-tier hit and of a cold restore from vaults,
with the bytes moved and the cold restore split into network, codec and cache injection. Figures are
medians over ``repeats`` runs. :func:`restore_agreement` measures what the lossy ``int8`` codec costs in
output quality. Both return plain dataclasses; rendering is the CLI's job.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tierkv.connectors.hf.session import ClusterLike, GenerationStats, TieredSession

logger = logging.getLogger(__name__)

QWEN25_05B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}
"""Geometry of Qwen2.5-0.5B (its KV: 24 layers x 2 KV heads x 64 dims, 12 KiB per token in bf16)."""


def qwen25_05b_like(dtype: torch.dtype = torch.bfloat16, seed: int = 0, **overrides: Any) -> Any:
    """A random-weight ``Qwen2ForCausalLM`` with Qwen2.5-0.5B's shape."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**{**QWEN25_05B, **overrides})
    model: Any = Qwen2ForCausalLM(config)
    return model.to(dtype).eval()


@dataclass
class TTFTPoint:
    """Medians at one prompt length. Times in seconds, bytes as moved over the network."""

    prompt_tokens: int
    prefill_ttft_s: float
    hot_ttft_s: float
    cold_ttft_s: float
    hot_restored_tokens: int
    cold_restored_tokens: int
    cold_bytes: int
    kv_bytes_per_token: int
    cold_network_s: float
    cold_codec_s: float
    cold_inject_s: float
    cold_plan_s: float
    cold_compute_s: float
    runs: dict[str, list[float]] = field(default_factory=dict)

    @property
    def hot_speedup(self) -> float:
        return self.prefill_ttft_s / self.hot_ttft_s if self.hot_ttft_s else 0.0

    @property
    def cold_speedup(self) -> float:
        return self.prefill_ttft_s / self.cold_ttft_s if self.cold_ttft_s else 0.0

    @property
    def cold_restore_s(self) -> float:
        return self.cold_plan_s + self.cold_network_s + self.cold_codec_s + self.cold_inject_s

    def restore_shares(self) -> dict[str, float]:
        """Fractions of the cold restore spent in network, codec and cache injection (and planning)."""
        total = self.cold_restore_s or 1.0
        return {
            "network": self.cold_network_s / total,
            "codec": self.cold_codec_s / total,
            "inject": self.cold_inject_s / total,
            "plan": self.cold_plan_s / total,
        }

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            hot_speedup=self.hot_speedup,
            cold_speedup=self.cold_speedup,
            cold_restore_s=self.cold_restore_s,
            restore_shares=self.restore_shares(),
        )
        return out


@dataclass
class HFBenchResult:
    """What :func:`run_hf_bench` measured."""

    model: str
    dtype: str
    codec: str
    block_size: int
    repeats: int
    torch_threads: int
    points: list[TTFTPoint]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["points"] = [p.to_dict() for p in self.points]
        return out


@contextmanager
def loopback_vaults(max_bytes: str = "2GiB", sync: str = "fast") -> Iterator[Any]:
    """Two vault processes on 127.0.0.1 (``kv_cold`` and ``ssm_cold``) and a cluster over them."""
    from tierkv.client.cluster import Cluster
    from tierkv.vault.launcher import VaultProcess

    with tempfile.TemporaryDirectory(prefix="tierkv-bench-") as tmp:
        kv = VaultProcess(Path(tmp) / "kv", max_bytes=max_bytes, role="kv_cold", sync=sync).start()
        ssm = VaultProcess(Path(tmp) / "ssm", max_bytes=max_bytes, role="ssm_cold", sync=sync)
        try:
            ssm.start()
            cluster = Cluster({"kv_cold": [kv.address], "ssm_cold": [ssm.address]}, timeout=30.0)
            try:
                yield cluster
            finally:
                cluster.close()
        finally:
            ssm.stop()
            kv.stop()


def _prompt(length: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, length), generator=g)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _measure_length(
    model: Any, cluster: ClusterLike, length: int, repeats: int, codec: str, block_size: int, seed: int
) -> TTFTPoint:
    """Prefill and hot hit per prompt first, then ship everything, then the cold restores.

    Storing all prompts before any cold restore keeps the vault's own write work (commits, page
    flushes) out of the restore timings, as in real use where a prefix returns long after it left.
    """
    vocab = int(model.config.vocab_size)
    session = TieredSession(model, cluster, codec=codec, block_size=block_size, hot_bytes=1 << 40)
    prompts = [_prompt(length, vocab, seed + 1000 * length + r) for r in range(repeats + 1)]
    prefill: list[GenerationStats] = []
    hot: list[GenerationStats] = []
    cold: list[GenerationStats] = []
    for ids in prompts[1:]:
        session.generate(ids, max_new_tokens=1)
        prefill.append(session.last_stats)
        session.generate(ids, max_new_tokens=1)
        hot.append(session.last_stats)
    session.generate(prompts[0], max_new_tokens=1)  # a warm-up prompt for the cold path
    session.persist(timeout=600)
    for i, ids in enumerate(prompts):
        session.hot.clear()
        session.generate(ids, max_new_tokens=1)
        if i == 0:
            continue
        cold.append(session.last_stats)
        if cold[-1].source != "cold":
            logger.warning("length %d: expected a cold restore, got %s", length, cold[-1].source)
    session.close()
    return TTFTPoint(
        prompt_tokens=length,
        prefill_ttft_s=_median([s.ttft_s for s in prefill]),
        hot_ttft_s=_median([s.ttft_s for s in hot]),
        cold_ttft_s=_median([s.ttft_s for s in cold]),
        hot_restored_tokens=hot[-1].restored_tokens,
        cold_restored_tokens=cold[-1].restored_tokens,
        cold_bytes=int(_median([s.bytes_fetched for s in cold])),
        kv_bytes_per_token=session.layout.kv_bytes_per_token(),
        cold_network_s=_median([s.network_s for s in cold]),
        cold_codec_s=_median([s.codec_s for s in cold]),
        cold_inject_s=_median([s.inject_s for s in cold]),
        cold_plan_s=_median([s.plan_s for s in cold]),
        cold_compute_s=_median([s.ttft_s - s.restore_s for s in cold]),
        runs={
            "prefill_ttft_s": [s.ttft_s for s in prefill],
            "hot_ttft_s": [s.ttft_s for s in hot],
            "cold_ttft_s": [s.ttft_s for s in cold],
        },
    )


def run_hf_bench(
    prompt_lengths: Sequence[int] = (1024, 4096),
    *,
    cluster: ClusterLike | None = None,
    codec: str = "raw",
    block_size: int = 16,
    repeats: int = 3,
    dtype: torch.dtype = torch.bfloat16,
    model: Any | None = None,
    seed: int = 0,
) -> HFBenchResult:
    """TTFT of prefill vs hot hit vs cold restore at each prompt length (see the module docstring).

    Without ``cluster`` two loopback vaults are started for the run and stopped afterwards. ``model``
    defaults to :func:`qwen25_05b_like` in ``dtype``.
    """
    if model is None:
        t = time.perf_counter()
        model = qwen25_05b_like(dtype, seed=seed)
        name = f"{type(model).__name__} (random weights, Qwen2.5-0.5B shape)"
        logger.info("built a Qwen2.5-0.5B-shaped model in %.1fs", time.perf_counter() - t)
    else:
        name = type(model).__name__
    with torch.no_grad():
        model(input_ids=torch.zeros((1, 8), dtype=torch.long))  # warm-up outside the measurements
    if cluster is None:
        with loopback_vaults() as own:
            points = [
                _measure_length(model, own, n, repeats, codec, block_size, seed) for n in prompt_lengths
            ]
    else:
        points = [
            _measure_length(model, cluster, n, repeats, codec, block_size, seed) for n in prompt_lengths
        ]
    return HFBenchResult(
        model=name,
        dtype=str(next(iter(model.parameters())).dtype).removeprefix("torch."),
        codec=codec,
        block_size=block_size,
        repeats=repeats,
        torch_threads=torch.get_num_threads(),
        points=points,
    )


@dataclass
class RestoreAgreement:
    """Greedy agreement and logit error of a cold restore against a full prefill.

    ``agreement``: fraction of the ``new_tokens`` free-running greedy tokens equal to the reference;
    ``first_divergence``: index of the first differing token (``new_tokens`` if none);
    ``teacher_forced_agreement``: argmax agreement when both read the reference sequence; logit
    errors are over those teacher-forced positions, ``logit_scale`` is the reference's max |logit|.
    """

    prompt_tokens: int
    restored_tokens: int
    new_tokens: int
    agreement: float
    first_divergence: int
    teacher_forced_agreement: float
    max_logit_error: float
    mean_logit_error: float
    logit_scale: float


def restore_agreement(
    model: Any,
    cluster: ClusterLike,
    *,
    codec: str = "int8",
    prompt_len: int = 512,
    new_tokens: int = 64,
    block_size: int = 16,
    seed: int = 0,
) -> RestoreAgreement:
    """Store a prompt's KV with ``codec``, restore it in a fresh session, compare with a full prefill.

    With ``raw`` this measures the model's own numerical noise between a prefill and a restore plus
    a short prefill (zero on float32 test models); the ``int8`` figure is read against it.
    """
    ids = _prompt(prompt_len, int(model.config.get_text_config(decoder=True).vocab_size), seed)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
    writer = TieredSession(model, cluster, codec=codec, block_size=block_size)
    writer.generate(ids, max_new_tokens=1)
    writer.persist(timeout=300)
    writer.close()

    reader = TieredSession(model, cluster, codec=codec, block_size=block_size)
    out = reader.generate(ids, max_new_tokens=new_tokens, do_sample=False)
    restored = reader.last_stats.restored_tokens
    n = min(out.shape[1], ref.shape[1]) - prompt_len
    same = (out[0, prompt_len : prompt_len + n] == ref[0, prompt_len : prompt_len + n]).tolist()
    first = same.index(False) if False in same else n

    cache, stats = reader.restore_cache(ids)
    p = stats.restored_tokens
    with torch.no_grad():
        full = model(input_ids=ref[:, :-1]).logits[0, prompt_len - 1 :].float()
        part = (
            model(
                input_ids=ref[:, p:-1],
                past_key_values=cache,
                position_ids=torch.arange(p, ref.shape[1] - 1).unsqueeze(0),
            )
            .logits[0, prompt_len - 1 - p :]
            .float()
        )
    reader.close()
    err = (full - part).abs()
    tf_agree = (full.argmax(-1) == part.argmax(-1)).float().mean().item()
    return RestoreAgreement(
        prompt_tokens=prompt_len,
        restored_tokens=restored,
        new_tokens=n,
        agreement=sum(same) / max(n, 1),
        first_divergence=first,
        teacher_forced_agreement=float(tf_agree),
        max_logit_error=float(err.max()),
        mean_logit_error=float(err.mean()),
        logit_scale=float(full.abs().max()),
    )


__all__ = [
    "QWEN25_05B",
    "HFBenchResult",
    "RestoreAgreement",
    "TTFTPoint",
    "loopback_vaults",
    "qwen25_05b_like",
    "restore_agreement",
    "run_hf_bench",
]
