"""``TieredSession``: transformers generation with a hot tier in process and vaults behind it.

One request goes:

1. **plan** — the hot tier's longest matching prefix; if the vaults could reach further, one prefix
   lookup on ``kv_cold`` (and, for hybrid models, a get of the state snapshot at the candidate
   boundary on ``ssm_cold``); at least one prompt token is always left to compute;
2. **restore** — one get per role for the blocks the hot tier does not cover, every blob verified;
   the KV (and state snapshot) go into a fresh ``DynamicCache``;
3. **compute** — hybrid models prefill up to the block boundaries where their recurrent state is
   snapshotted; then ``generate`` continues from the cache;
4. **keep** — the whole sequence's KV (and snapshots) becomes a hot entry. When the hot tier evicts
   an entry its full blocks are shipped to the vaults in the background (store-on-evict), with
   bounded in-flight work.

A vault failure is a miss: the storage never raises, blobs that fail verification are not used (and
are deleted from the vaults), and the tokens are recomputed.

This module is the thin driver; the parts are :mod:`~tierkv.connectors.hf.planner` (1),
:mod:`~tierkv.connectors.hf.restorer` (2), :mod:`~tierkv.connectors.hf.snapshots` (3) and
:mod:`~tierkv.connectors.hf.writer` (4), over the pipeline of :mod:`tierkv.tiering`.

Not supported (refused with :class:`~tierkv.errors.ConfigError` at construction): sliding-window
attention layers (the cache keeps only the window), models whose output changes when a prompt is
continued over their cache (Jamba's torch path), and models that keep their state outside
``past_key_values`` (Mamba / Mamba2 ``cache_params``). One sequence per call (batch size 1).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

import torch

from tierkv.config import ContextWeights
from tierkv.connectors.hf.blocks import ModelBlocks
from tierkv.connectors.hf.hot import HotTier, TokenArray, as_tokens
from tierkv.connectors.hf.layout import (
    CacheLayout,
    cache_kwargs,
    check_continuation,
    extract_kv,
    model_device,
    probe_layout,
    snapshot_states,
)
from tierkv.connectors.hf.payload import HotPayload, merge_meta
from tierkv.connectors.hf.planner import RestorePlanner
from tierkv.connectors.hf.restorer import RestoredCache, Restorer
from tierkv.connectors.hf.snapshots import Snapshotter
from tierkv.connectors.hf.stats import GenerationStats, StepObserver
from tierkv.connectors.hf.streams import Streams, weights_fingerprint
from tierkv.connectors.hf.text import decode, encode_with_offsets, tokenized_generation
from tierkv.connectors.hf.textmatch import TextIndex, plan_from_index
from tierkv.connectors.hf.writer import EvictWriter
from tierkv.errors import ConfigError
from tierkv.retention import BlockMeta, Chunk, Layout, Retention, as_chunks, tag_blocks, with_generation
from tierkv.retention.classes import NEUTRAL_IMPORTANCE
from tierkv.tiering import ColdTier, Storage, full_blocks
from tierkv.tiering.checks import SessionSettings
from tierkv.tiering.tensors import TorchArrays

logger = logging.getLogger(__name__)

ClusterLike = Storage
"""What the session needs from the vaults (the pipeline's :class:`~tierkv.tiering.Storage`)."""


class TieredSession:
    """Greedy (or any ``generate``) decoding with KV reuse from a hot tier and vaults.

    ``cluster`` is the vaults as a :class:`~tierkv.tiering.Storage` (``open_cluster(config)``), or
    ``None``: hot tier only. The other keyword arguments are the fields of
    :class:`~tierkv.tiering.checks.SessionSettings` (``codec``, ``block_size``, ``hot_bytes``,
    ``state_stride_blocks``, ``max_inflight_stores``, ``put_batch_bytes``, ``min_text_fraction``,
    ``model_id``, ``tenant``, ``prefetch_bytes``, ``decode_behind``), with its defaults and
    bounds; a bad one is a ConfigError. ``retention``
    is the class table a prompt layout is tagged by (default: :class:`~tierkv.retention.Retention`'s);
    ``weights`` score the hot tier's entries as the vaults' ``context`` policy does (``[retention.weights]``
    of tierkv.toml: ``config.retention.weights``).
    """

    def __init__(
        self,
        model: Any,
        cluster: Storage | None = None,
        *,
        retention: Retention | None = None,
        weights: ContextWeights | None = None,
        **options: Any,
    ) -> None:
        settings = SessionSettings.from_options(options)
        self.settings = settings
        self.model = model
        self.cluster = cluster
        self.retention = retention or Retention()
        self.codec = settings.codec
        self.block_size = block_size = settings.block_size
        self.state_stride_blocks = state_stride_blocks = settings.state_stride_blocks
        self.put_batch_bytes = settings.put_batch_bytes
        self.min_text_fraction = settings.min_text_fraction
        self.device = model_device(model)
        self.layout: CacheLayout = probe_layout(model)
        continuation = check_continuation(model, decode=self.layout.has_states)
        self.decode_snapshots = continuation.decode_matches_prefill()
        if continuation.decoded is not None and not self.decode_snapshots:
            logger.info(
                "%s: decoding drifts from prefill by %.2g (relative); recurrent state is snapshotted "
                "during prefill only",
                type(model).__name__,
                continuation.decoded,
            )
        self.blocks = ModelBlocks(self.layout, block_size)
        identity = settings.model_id if settings.model_id is not None else weights_fingerprint(model)
        self.streams = Streams(model, self.blocks, settings.codec, identity, settings.tenant)
        self.namespace: bytes = self.streams.namespace.digest
        tier = (
            None
            if cluster is None
            else ColdTier(
                cluster,
                TorchArrays(),
                max_put_bytes=self.put_batch_bytes,
                prefetch_bytes=settings.prefetch_bytes,  # restores take prefetched blocks first
                decode_behind=settings.decode_behind,
            )
        )
        self.writer = EvictWriter(tier, self.streams, self.blocks, settings.max_inflight_stores)
        self.hot: HotTier[HotPayload] = HotTier(
            settings.hot_bytes, on_evict=self.writer.on_evict, weights=weights
        )
        self.planner = RestorePlanner(
            self.blocks, self.streams, self.hot, tier, state_stride_blocks, self.device
        )
        self.restorer = Restorer(model, self.blocks, self.streams, tier, self.device)
        self.snapshots = Snapshotter(model, self.layout, block_size, state_stride_blocks, self.device)
        self.text_index = TextIndex()
        self._lock = threading.Lock()
        self.last_stats = GenerationStats()

    @property
    def stored_blobs(self) -> int:
        """Blobs the vaults' replies said they stored, so far."""
        return self.writer.stored_blobs

    @property
    def refused_blobs(self) -> int:
        """Blobs a vault refused and none stored, so far (budget, tenant quota or no room)."""
        return self.writer.tally.rejected

    @property
    def stored_bytes(self) -> int:
        """Bytes of the blobs the vaults acknowledged so far."""
        return self.writer.stored_bytes

    # -------------------------------------------------------------------------------------- public

    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int = 32,
        *,
        layout: Layout | None = None,
        **generate_kwargs: Any,
    ) -> torch.Tensor:
        """Like ``model.generate`` for one sequence: returns prompt + new tokens, ``[1, len]``.

        ``layout`` describes the prompt as ordered chunks of token spans (``[{"tokens": [0, 512],
        "source": "axioms", "priority": 5}, ...]`` or :class:`~tierkv.retention.Chunk` objects): the
        blocks this sequence stores are tagged with them, a block spanning two chunks taking the more
        protective, and the tokens generated past the prompt are tagged ``generation``. Without a layout
        nothing is tagged. A malformed layout is a :class:`~tierkv.retention.LayoutError` before any work.
        """
        chunks = None if layout is None else as_chunks(layout)
        with self._lock:
            return self._generate(input_ids, max_new_tokens, generate_kwargs, chunks)

    def generate_text(
        self,
        text: str,
        tokenizer: Any,
        max_new_tokens: int = 32,
        *,
        layout: Layout | None = None,
        **generate_kwargs: Any,
    ) -> str:
        """Generate from a whole-conversation text, reusing stored prefixes by characters.

        The text is compared with recently served texts (EXACT / EXTEND / DIVERGE, see
        :mod:`tierkv.connectors.hf.textmatch`); stored tokens inside the matching characters are reused
        verbatim and only the rest is tokenized (no special tokens are added: a chat template
        renders them as text). Returns the completion text. ``layout`` is as for :meth:`generate`, and
        its chunks may also be character spans of ``text`` (``{"chars": [0, 2048], ...}``), mapped to
        the tokens through the tokenizer's offsets.
        """
        with self._lock:
            tplan = plan_from_index(
                self.text_index,
                text,
                functools.partial(encode_with_offsets, tokenizer),
                self.min_text_fraction,
            )
            ids = list(tplan.tokenized.ids)
            if not ids:
                raise ConfigError("TieredSession", "text", "the text tokenizes to no tokens")
            offsets = list(zip(tplan.tokenized.starts, tplan.tokenized.ends, strict=True))
            chunks = None if layout is None else as_chunks(layout, offsets)
            prompt = torch.tensor([ids], dtype=torch.long)
            out = self._generate(prompt, max_new_tokens, generate_kwargs, chunks)
            generated = out[0, len(ids) :].tolist()
            self.text_index.add(tplan.tokenized)
            self.text_index.add(tplan.tokenized.concat(tokenized_generation(tokenizer, generated)))
            self.last_stats.text_match = tplan.kind.value
            self.last_stats.reused_text_tokens = tplan.reused_tokens
            return decode(tokenizer, generated, skip_special_tokens=True)

    def restore_cache(self, input_ids: Any) -> tuple[Any, GenerationStats]:
        """A ``DynamicCache`` holding as much of ``input_ids`` as the tiers can restore.

        For callers that drive the model themselves: feed ``input_ids[:, stats.restored_tokens:]``
        with ``position_ids`` starting at ``stats.restored_tokens``. Nothing is added to the hot tier.
        """
        with self._lock:
            ids = self._prompt(input_ids)
            stats = GenerationStats(prompt_tokens=int(ids.shape[1]))
            restored = self._restore(as_tokens(ids[0].cpu().numpy()), stats)
            return restored.cache, stats

    def warm(self, limit: int = 32) -> int:
        """Fill the hot tier from the vaults' hottest chains of this session's namespace (``Hottest``;
        blocks carry token ids only under ``[retention] warm_tokens``): each is restored into an entry
        as a request for it would be, without generating. Coldest first, so the hottest end up the most
        recent. Returns how many chains were restored; 0 without vaults."""
        if self.cluster is None:
            return 0
        warmed = 0
        for chain in reversed(self.cluster.hottest(self.namespace, limit=limit)):
            if chain.tokens:
                warmed += self._warm_one(list(chain.tokens))
        return warmed

    def _warm_one(self, ids: list[int]) -> int:
        """Restore one chain (every full block: a restore leaves the last prompt token to compute, so it
        is planned for the chain plus one token) into a hot entry; 1 if anything was restored. An entry
        that already covers it (the vaults list a hit chain after its unhit longer run, which came
        first) counts it as a hit instead, so it ranks where the chain does."""
        with self._lock:
            if self.hot.covers(ids):
                self.hot.longest_prefix(ids)
                return 0
            stats = GenerationStats(prompt_tokens=len(ids) + 1)
            restored = self._restore(as_tokens([*ids, 0]), stats)
            if stats.restored_tokens <= 0:
                return 0
            self._keep(torch.tensor(ids), restored.cache, restored, None)
        return 1

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for background stores to finish; False if ``timeout`` passed first."""
        return self.writer.flush(timeout)

    def persist(self, timeout: float | None = None) -> bool:
        """Ship every hot entry to the vaults now (as if evicted) and wait for the stores."""
        with self._lock:
            self.hot.evict_all()
        return self.flush(timeout)

    def close(self, persist: bool = True, timeout: float | None = 30.0) -> None:
        """Ship the hot tier to the vaults (unless ``persist=False``), then stop background work.

        Persisting is the default because what a session computed is expected to be there for the next
        process: the hot tier otherwise reaches the vaults only on eviction. The storage is not closed.
        """
        if persist:
            self.persist(timeout)
        self.writer.close(timeout)

    def __enter__(self) -> TieredSession:
        return self

    def __exit__(self, *exc: object) -> None:
        """Leaving a ``with`` block closes the session, persisting its hot tier."""
        self.close()

    # ---------------------------------------------------------------------------------- generation

    def _prompt(self, input_ids: Any) -> torch.Tensor:
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        if ids.dim() != 2 or ids.shape[0] != 1:
            raise ConfigError(
                "TieredSession", "input_ids", f"expected one sequence, got shape {tuple(ids.shape)}"
            )
        if ids.shape[1] < 1:
            raise ConfigError("TieredSession", "input_ids", "the prompt is empty")
        return ids.to(self.device)

    def _generate(
        self, input_ids: Any, max_new_tokens: int, kwargs: dict[str, Any], chunks: list[Chunk] | None = None
    ) -> torch.Tensor:
        start = time.perf_counter()
        ids = self._prompt(input_ids)
        mask = kwargs.pop("attention_mask", None)
        if mask is not None and not bool(torch.as_tensor(mask).all()):
            raise ConfigError("TieredSession", "attention_mask", "padding is not supported (one sequence)")
        tokens = as_tokens(ids[0].cpu().numpy())
        stats = GenerationStats(prompt_tokens=len(tokens))
        restored = self._restore(tokens, stats)
        plan = restored.plan
        cache = restored.cache
        states = restored.states
        if self.layout.has_states:
            self.snapshots.prefill(ids, cache, plan.restored, states)
        on_step = (
            functools.partial(self.snapshots.while_decoding, cache, states, ids.shape[1])
            if self.layout.has_states and self.decode_snapshots
            else None
        )
        timer = StepObserver(kwargs.pop("streamer", None), ids.shape[1], on_step)
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                streamer=timer,
                **cache_kwargs(self.model, cache),
                **kwargs,
            )
        end = time.perf_counter()
        sequences: torch.Tensor = out.sequences if hasattr(out, "sequences") else out
        stats.generated_tokens = int(sequences.shape[1] - ids.shape[1])
        stats.ttft_s = (timer.first_at or end) - start
        stats.total_s = end - start
        meta = self._tags(chunks, len(tokens), sequences[0])
        self._keep(sequences[0], cache, restored, meta)
        self.last_stats = stats
        return sequences

    def _tags(
        self, chunks: list[Chunk] | None, prompt_tokens: int, sequence: torch.Tensor
    ) -> list[BlockMeta] | None:
        """Each full block's metadata: the layout's chunks, and ``generation`` after the prompt, with the
        block's token ids under ``[retention] warm_tokens``; None when there is neither."""
        ids = sequence.tolist() if self.retention.warm_tokens else None
        if chunks is None and ids is None:
            return None
        bs, total = self.block_size, int(sequence.shape[0])
        tagged = [] if chunks is None else with_generation(chunks, prompt_tokens, total)
        return tag_blocks(tagged, full_blocks(total, bs), bs, self.retention, tokens=ids)

    def _keep(
        self, sequence: torch.Tensor, cache: Any, restored: RestoredCache, meta: list[BlockMeta] | None
    ) -> None:
        """Make the finished sequence's cache a hot entry (merging what superseded entries knew)."""
        kv = extract_kv(self.layout, cache)
        length = int(kv[0][0].shape[2]) if kv else int(sequence.shape[0]) - 1
        tokens = as_tokens(sequence[:length].cpu().numpy())
        payload = HotPayload(
            kv=kv,
            states=restored.states,
            cold_blocks=restored.cold_blocks,
            cold_states=restored.cold_states,
            meta=merge_meta(meta, restored.meta),
        )
        if self.layout.has_states and self.decode_snapshots:
            payload.states[length] = snapshot_states(self.layout, cache)
        for old in self.hot.superseded_by(tokens):
            payload.merge(old.payload)
        kept = [m for m in payload.meta or () if m.tagged]
        self.hot.put(
            tokens,
            payload,
            payload.nbytes(),
            importance=max((m.importance for m in kept), default=NEUTRAL_IMPORTANCE),
            protected=any(m.protected for m in kept),
        )

    # ------------------------------------------------------------------------------------- restore

    def _restore(self, tokens: TokenArray, stats: GenerationStats) -> RestoredCache:
        """Plan (hot tier, vault lookup, state snapshot), then fetch and build the cache."""
        restored = self.restorer.restore(self.planner.plan(tokens, stats), stats)
        stats.planned(restored.plan)
        return restored


__all__ = ["ClusterLike", "GenerationStats", "TieredSession", "weights_fingerprint"]
