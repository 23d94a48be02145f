"""What a lossy KV codec costs in output: a restored prompt's continuation against a full prefill's.

``tierkv bench hf --codec int8`` runs :func:`restore_agreement` for ``raw`` (the model's own noise
between a prefill and a restore followed by a short prefill; zero on float32 models) and for ``int8``;
the int8 figures are read against the raw ones. Greedy agreement over free-running generation is harsh
on random-weight models (nearly flat logits: one flipped argmax changes everything after it), so the
teacher-forced agreement and the logit error, which compare position by position on the same tokens,
are reported beside it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from tierkv.connectors.hf import ClusterLike, TieredSession
from tierkv.connectors.hf.layout import cache_kwargs

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RestoreAgreement:
    """Greedy agreement and logit error of a cold restore against a full prefill.

    ``agreement``: fraction of the ``new_tokens`` free-running greedy tokens equal to the reference;
    ``first_divergence``: index of the first differing token (``new_tokens`` if none);
    ``teacher_forced_agreement``: argmax agreement when both read the reference sequence; logit
    errors are over those teacher-forced positions, ``logit_scale`` is the reference's max |logit|.
    """

    codec: str
    prompt_tokens: int
    restored_tokens: int
    new_tokens: int
    agreement: float
    first_divergence: int
    teacher_forced_agreement: float
    max_logit_error: float
    mean_logit_error: float
    logit_scale: float


def random_prompt(tokens: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """``[1, tokens]`` ids drawn uniformly: no two prompts share a prefix, nothing is cached by chance."""
    return torch.randint(0, vocab, (1, tokens), generator=generator)


def restore_agreement(
    model: Any,
    cluster: ClusterLike,
    *,
    codec: str = "int8",
    prompt_len: int = 512,
    new_tokens: int = 64,
    block_size: int = 16,
    seed: int = 0,
    model_id: str | None = None,
) -> RestoreAgreement:
    """Store a prompt's KV with ``codec``, restore it in a fresh session, compare with a full prefill.

    ``model_id`` names the namespace (default: a fingerprint of the weights); the prompt is drawn from
    ``seed``, so one seed gives one prompt for every codec.
    """
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    device = next(iter(model.parameters())).device
    ids = random_prompt(prompt_len, vocab, torch.Generator().manual_seed(seed)).to(device)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
    writer = TieredSession(model, cluster, codec=codec, block_size=block_size, model_id=model_id)
    writer.generate(ids, max_new_tokens=1)
    writer.persist(timeout=300)
    writer.close()

    reader = TieredSession(model, cluster, codec=codec, block_size=block_size, model_id=model_id)
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
                **cache_kwargs(model, cache),
                position_ids=torch.arange(p, ref.shape[1] - 1, device=device).unsqueeze(0),
            )
            .logits[0, prompt_len - 1 - p :]
            .float()
        )
    reader.close(persist=False)
    err = (full - part).abs()
    tf_agree = (full.argmax(-1) == part.argmax(-1)).float().mean().item()
    return RestoreAgreement(
        codec=codec,
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


__all__ = ["RestoreAgreement", "random_prompt", "restore_agreement"]
