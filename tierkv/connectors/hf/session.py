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

A vault failure is a miss: the cluster never raises, blobs that fail verification are not used, and
the tokens are recomputed.

Not supported (refused with :class:`~tierkv.errors.ConfigError` at construction): sliding-window
attention layers (the cache keeps only the window), models whose output changes when a prompt is
continued over their cache (Jamba's torch path), and models that keep their state outside
``past_key_values`` (Mamba / Mamba2 ``cache_params``). One sequence per call (batch size 1).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from tierkv.codec import CODECS, Buffer, LayerGroup
from tierkv.connectors.hf.blocks import BlockCodec
from tierkv.connectors.hf.hot import HotEntry, HotTier, TokenArray, as_tokens
from tierkv.connectors.hf.layout import (
    KV,
    CacheLayout,
    StateSnapshot,
    build_cache,
    check_continuation,
    extract_kv,
    kv_nbytes,
    model_device,
    probe_layout,
    snapshot_states,
)
from tierkv.connectors.hf.plan import RestorePlan, plan_restore
from tierkv.connectors.hf.text import decode, encode_with_offsets, tokenized_generation
from tierkv.connectors.hf.textmatch import DEFAULT_MIN_FRACTION, TextIndex, plan_from_index
from tierkv.errors import ConfigError
from tierkv.keys import Namespace, block_keys
from tierkv.tiering.background import BoundedWorker
from tierkv.tiering.batches import byte_batches
from tierkv.tiering.checks import at_least, one_of
from tierkv.tiering.positions import full_blocks, restore_limit, snapshot_boundaries, snapshot_candidates

logger = logging.getLogger(__name__)

KV_ROLE = "kv_cold"
STATE_ROLE = "ssm_cold"
LAYOUT_VERSION = 1
_GROUP_TAGS = {LayerGroup.SSM: b"tierkv/ssm", LayerGroup.CONV: b"tierkv/conv"}


class ClusterLike(Protocol):
    """What the session needs from :class:`tierkv.client.cluster.Cluster`."""

    def put(self, namespace: bytes, items: Mapping[bytes, bytes], role: str = ...) -> int: ...

    def get_buffers(
        self, namespace: bytes, keys: Sequence[bytes], role: str = ...
    ) -> Sequence[Buffer | None]: ...

    def prefix_lookup(self, namespace: bytes, keys: Sequence[bytes], role: str = ...) -> int: ...


@dataclass
class GenerationStats:
    """What one ``generate`` call did. Token counts refer to the prompt; times are seconds.

    ``hot_hits`` / ``cold_hits`` are prompt tokens restored from the hot tier / the vaults;
    ``network_s``, ``codec_s`` and ``inject_s`` split the restore into vault calls, blob decoding and
    building the cache; ``ttft_s`` runs from the call to the first generated token.
    """

    prompt_tokens: int = 0
    restored_tokens: int = 0
    computed_tokens: int = 0
    generated_tokens: int = 0
    hot_hits: int = 0
    cold_hits: int = 0
    cold_blocks: int = 0
    rejected_blobs: int = 0
    bytes_fetched: int = 0
    source: str = "none"
    ttft_s: float = 0.0
    total_s: float = 0.0
    plan_s: float = 0.0
    network_s: float = 0.0
    codec_s: float = 0.0
    inject_s: float = 0.0
    text_match: str | None = None
    reused_text_tokens: int = 0

    @property
    def restore_s(self) -> float:
        return self.plan_s + self.network_s + self.codec_s + self.inject_s


@dataclass
class _HotPayload:
    """A hot entry: KV of every attention layer, state snapshots by position, and what the vaults hold."""

    kv: list[KV]
    states: dict[int, StateSnapshot] = field(default_factory=dict)
    cold_blocks: int = 0
    cold_states: set[int] = field(default_factory=set)

    def nbytes(self) -> int:
        return kv_nbytes(self.kv) + sum(s.nbytes for s in self.states.values())


@dataclass
class _Restored:
    cache: Any
    plan: RestorePlan
    states: dict[int, StateSnapshot]
    cold_blocks: int
    cold_states: set[int]


class _StepObserver:
    """A generate streamer that notes when the first new token arrives and reports each step.

    ``generate`` calls ``put`` once with the prompt and then once per new token, after the forward
    pass that produced it; at the k-th token the cache therefore covers ``prompt_len + k - 1``
    tokens, which ``on_step`` receives. Values are passed on to the caller's streamer, if any.
    """

    def __init__(self, inner: Any | None, prompt_len: int, on_step: Callable[[int], None] | None) -> None:
        self.inner = inner
        self.prompt_len = prompt_len
        self.on_step = on_step
        self.calls = 0
        self.first_at: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_at = time.perf_counter()
        if self.calls >= 2 and self.on_step is not None:
            self.on_step(self.prompt_len + self.calls - 2)
        if self.inner is not None:
            self.inner.put(value)

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()


def weights_fingerprint(model: Any, sample: int = 256) -> str:
    """A cheap identity of a model's weights: its name, config and the first and last values of each tensor.

    Two models with the same config but different weights (fine-tunes, random inits) get different
    namespaces, so one never restores the other's KV. Pass ``model_id`` to skip it.
    """
    h = hashlib.sha256(str(getattr(model.config, "_name_or_path", "")).encode())
    h.update(model.config.to_json_string(use_diff=False).encode())
    with torch.no_grad():
        for name, p in model.state_dict().items():
            flat = p.detach().reshape(-1)
            h.update(name.encode())
            for part in (flat[:sample], flat[-sample:]):
                h.update(part.to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class TieredSession:
    """Greedy (or any ``generate``) decoding with KV reuse from a hot tier and vaults.

    ``cluster`` is a :class:`tierkv.client.cluster.Cluster` (or ``None``: hot tier only). ``codec``
    is the KV codec (``"raw"`` or ``"int8"``); recurrent states are always stored raw. ``hot_bytes``
    bounds the in-process tier; ``state_stride_blocks`` sets how often a hybrid model's recurrent
    state is snapshotted during prefill (every that many blocks, plus the last block boundary of the
    prompt); ``max_inflight_stores`` bounds background store work.
    """

    def __init__(
        self,
        model: Any,
        cluster: ClusterLike | None = None,
        *,
        codec: str = "raw",
        block_size: int = 16,
        hot_bytes: int = 1 << 30,
        state_stride_blocks: int = 8,
        max_inflight_stores: int = 4,
        put_batch_bytes: int = 16 << 20,
        min_text_fraction: float = DEFAULT_MIN_FRACTION,
        model_id: str | None = None,
        tenant: str = "",
    ) -> None:
        one_of("TieredSession", "codec", codec, CODECS)
        at_least("TieredSession", "block_size", block_size, 1)
        at_least("TieredSession", "state_stride_blocks", state_stride_blocks, 1)
        if not 0.0 < min_text_fraction <= 1.0:
            raise ConfigError("TieredSession", "min_text_fraction", "must be in (0, 1]")
        self.model = model
        self.cluster = cluster
        self.codec = codec
        self.block_size = block_size
        self.state_stride_blocks = state_stride_blocks
        self.put_batch_bytes = put_batch_bytes
        self.min_text_fraction = min_text_fraction
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
        self.blocks = BlockCodec(self.layout, block_size, codec)
        identity = model_id if model_id is not None else weights_fingerprint(model)
        self._ns = self._namespace(identity, tenant)
        self.namespace: bytes = self._ns.digest
        self.hot: HotTier[_HotPayload] = HotTier(hot_bytes, on_evict=self._on_evict)
        self.text_index = TextIndex()
        self._worker = BoundedWorker(max_inflight_stores, name="tierkv-hf-store")
        self._lock = threading.Lock()
        self.last_stats = GenerationStats()
        self.stored_blobs = 0
        self.stored_bytes = 0

    def _namespace(self, identity: str, tenant: str) -> Namespace:
        return Namespace.from_config(
            self.model.config.to_dict(),
            model=identity,
            dtype=self.layout.kv_dtype,
            codec=self.codec,
            block_size=self.block_size,
            layout=f"hf-v{LAYOUT_VERSION}/{self.layout.describe()}",
            tenant=tenant,
        )

    # ----------------------------------------------------------------------------------------- keys

    def _kv_keys(self, tokens: TokenArray, blocks: int) -> list[bytes]:
        return block_keys(tokens[: blocks * self.block_size], self.block_size, namespace=self._ns)

    def _state_keys(self, tokens: TokenArray, blocks: int) -> dict[LayerGroup, list[bytes]]:
        """Per state group, the chained key of each block boundary (distinct from the KV chain)."""
        ids = tokens[: blocks * self.block_size]
        return {
            g: block_keys(ids, self.block_size, extra=_GROUP_TAGS[g], namespace=self._ns)
            for g in self.blocks.state_groups()
        }

    # -------------------------------------------------------------------------------------- public

    def generate(self, input_ids: Any, max_new_tokens: int = 32, **generate_kwargs: Any) -> torch.Tensor:
        """Like ``model.generate`` for one sequence: returns prompt + new tokens, ``[1, len]``."""
        with self._lock:
            return self._generate(input_ids, max_new_tokens, generate_kwargs)

    def generate_text(
        self, text: str, tokenizer: Any, max_new_tokens: int = 32, **generate_kwargs: Any
    ) -> str:
        """Generate from a whole-conversation text, reusing stored prefixes by characters.

        The text is compared with recently served texts (EXACT / EXTEND / DIVERGE, see
        :mod:`tierkv.connectors.hf.textmatch`); stored tokens inside the matching characters are reused
        verbatim and only the rest is tokenized (no special tokens are added: a chat template
        renders them as text). Returns the completion text.
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
            out = self._generate(torch.tensor([ids], dtype=torch.long), max_new_tokens, generate_kwargs)
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
            self._fill_stats(stats, restored.plan)
            return restored.cache, stats

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for background stores to finish; False if ``timeout`` passed first."""
        return self._worker.drain(timeout)

    def persist(self, timeout: float | None = None) -> bool:
        """Ship every hot entry to the vaults now (as if evicted) and wait for the stores."""
        with self._lock:
            self.hot.evict_all()
        return self.flush(timeout)

    def close(self, persist: bool = False, timeout: float | None = 30.0) -> None:
        """Stop background work (after shipping the hot tier when ``persist``). The cluster is not closed."""
        if persist:
            self.persist(timeout)
        self._worker.close(timeout)

    def __enter__(self) -> TieredSession:
        return self

    def __exit__(self, *exc: object) -> None:
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

    def _generate(self, input_ids: Any, max_new_tokens: int, kwargs: dict[str, Any]) -> torch.Tensor:
        start = time.perf_counter()
        ids = self._prompt(input_ids)
        mask = kwargs.pop("attention_mask", None)
        if mask is not None and not bool(torch.as_tensor(mask).all()):
            raise ConfigError("TieredSession", "attention_mask", "padding is not supported (one sequence)")
        tokens = as_tokens(ids[0].cpu().numpy())
        stats = GenerationStats(prompt_tokens=len(tokens))
        restored = self._restore(tokens, stats)
        plan = restored.plan
        self._fill_stats(stats, plan)
        cache = restored.cache
        states = restored.states
        if self.layout.has_states:
            self._prefill_to_boundaries(ids, cache, plan.restored, states)
        on_step = (
            functools.partial(self._snapshot_while_decoding, cache, states, ids.shape[1])
            if self.layout.has_states and self.decode_snapshots
            else None
        )
        timer = _StepObserver(kwargs.pop("streamer", None), ids.shape[1], on_step)
        with torch.no_grad():
            out = self.model.generate(
                ids,
                past_key_values=cache,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                streamer=timer,
                **kwargs,
            )
        end = time.perf_counter()
        sequences: torch.Tensor = out.sequences if hasattr(out, "sequences") else out
        stats.generated_tokens = int(sequences.shape[1] - ids.shape[1])
        stats.ttft_s = (timer.first_at or end) - start
        stats.total_s = end - start
        self._keep(sequences[0], cache, restored)
        self.last_stats = stats
        return sequences

    @staticmethod
    def _fill_stats(stats: GenerationStats, plan: RestorePlan) -> None:
        stats.restored_tokens = plan.restored
        stats.computed_tokens = plan.computed
        stats.source = plan.source
        stats.hot_hits = plan.hot_tokens
        stats.cold_hits = plan.cold_tokens
        stats.cold_blocks = plan.cold_blocks

    def _prefill_to_boundaries(
        self, ids: torch.Tensor, cache: Any, restored: int, states: dict[int, StateSnapshot]
    ) -> None:
        """Run the prompt up to each snapshot boundary and clone the recurrent state there.

        Besides the block boundaries (which the vaults can serve) the state is also snapshotted after
        ``len(prompt) - 1`` tokens, so the hot tier can serve the same prompt again with one token
        left to compute.
        """
        limit = restore_limit(ids.shape[1])
        boundaries = snapshot_boundaries(restored, limit, self.block_size, self.state_stride_blocks)
        if limit > max([restored, *boundaries]):
            boundaries.append(limit)
        pos = restored
        with torch.no_grad():
            for boundary in boundaries:
                self.model(
                    input_ids=ids[:, pos:boundary],
                    past_key_values=cache,
                    use_cache=True,
                    attention_mask=torch.ones((1, boundary), dtype=torch.long, device=self.device),
                    position_ids=torch.arange(pos, boundary, device=self.device).unsqueeze(0),
                    logits_to_keep=1,
                )
                states[boundary] = snapshot_states(self.layout, cache)
                pos = boundary

    def _snapshot_while_decoding(
        self, cache: Any, states: dict[int, StateSnapshot], prompt_len: int, position: int
    ) -> None:
        """Snapshot the recurrent state at block boundaries reached while generating.

        Of the boundaries inside the reply only stride multiples and the latest are kept: the latest
        is where a follow-up turn (prompt + this reply + more) can be restored from the vaults. A
        snapshot is taken only when the attention KV confirms the cache covers ``position`` tokens.
        """
        if position % self.block_size or position in states:
            return
        if self.layout.has_kv and extract_kv(self.layout, cache)[0][0].shape[2] != position:
            return
        step = self.block_size * self.state_stride_blocks
        for old in [p for p in states if p >= prompt_len and p % step]:
            del states[old]
        states[position] = snapshot_states(self.layout, cache)

    def _keep(self, sequence: torch.Tensor, cache: Any, restored: _Restored) -> None:
        """Make the finished sequence's cache a hot entry (merging what superseded entries knew)."""
        kv = extract_kv(self.layout, cache)
        length = int(kv[0][0].shape[2]) if kv else int(sequence.shape[0]) - 1
        tokens = as_tokens(sequence[:length].cpu().numpy())
        payload = _HotPayload(
            kv=kv, states=restored.states, cold_blocks=restored.cold_blocks, cold_states=restored.cold_states
        )
        if self.layout.has_states and self.decode_snapshots:
            payload.states[length] = snapshot_states(self.layout, cache)
        for old in self.hot.superseded_by(tokens):
            for pos, snap in old.payload.states.items():
                payload.states.setdefault(pos, snap)
            payload.cold_blocks = max(payload.cold_blocks, old.payload.cold_blocks)
            payload.cold_states |= old.payload.cold_states
        self.hot.put(tokens, payload, payload.nbytes())

    # ------------------------------------------------------------------------------------- restore

    def _hot_usable(self, limit: int) -> Callable[[HotEntry[_HotPayload], int], int]:
        def usable(entry: HotEntry[_HotPayload], lcp: int) -> int:
            n = min(lcp, limit)
            if not self.layout.has_states:
                return n
            return max((p for p in entry.payload.states if p <= n), default=0)

        return usable

    def _restore(self, tokens: TokenArray, stats: GenerationStats) -> _Restored:
        t0 = time.perf_counter()
        n_tokens = len(tokens)
        limit = restore_limit(n_tokens)
        entry, hot_n = self.hot.longest_prefix(tokens, usable=self._hot_usable(limit))
        max_blocks = full_blocks(limit, self.block_size)
        cold_n = 0
        lookup_n = 0
        keys: list[bytes] = []
        cold_state: StateSnapshot | None = None
        stats.plan_s = time.perf_counter() - t0
        if self.cluster is not None and max_blocks * self.block_size > hot_n:
            keys = self._kv_keys(tokens, max_blocks)
            if self.layout.has_kv:
                t = time.perf_counter()
                lookup_n = self.cluster.prefix_lookup(self.namespace, keys, role=KV_ROLE)
                stats.network_s += time.perf_counter() - t
            else:
                lookup_n = max_blocks
            cold_n = lookup_n
            if self.layout.has_states and cold_n * self.block_size > hot_n:
                cold_n, cold_state = self._fetch_states(tokens, cold_n, hot_n, stats)
        plan = plan_restore(n_tokens, self.block_size, hot_n, cold_n)
        restored_kv: torch.Tensor | None = None
        if plan.cold_blocks and self.layout.has_kv:
            restored_kv, plan = self._fetch_kv(keys, plan, entry, hot_n, stats)
        if plan.cold_blocks == 0:
            cold_state = None
        t = time.perf_counter()
        kv, states = self._assemble(entry, plan, restored_kv, cold_state)
        cache = build_cache(self.model, self.layout, kv, states.get(plan.restored))
        stats.inject_s += time.perf_counter() - t
        cold_states: set[int] = set()
        cold_known = 0
        if entry is not None and plan.hot_tokens:
            cold_known = min(entry.payload.cold_blocks, full_blocks(plan.restored, self.block_size))
            cold_states = {p for p in entry.payload.cold_states if p <= plan.restored}
        if plan.cold_blocks:
            cold_known = max(cold_known, lookup_n)
            if cold_state is not None:
                cold_states.add(plan.restored)
        return _Restored(cache, plan, states, cold_known, cold_states)

    def _assemble(
        self,
        entry: HotEntry[_HotPayload] | None,
        plan: RestorePlan,
        restored_kv: torch.Tensor | None,
        cold_state: StateSnapshot | None,
    ) -> tuple[list[KV], dict[int, StateSnapshot]]:
        """Per-layer KV of the restored prefix and the state snapshots known to hold for it.

        ``restored_kv`` (hot prefix and cold blocks in one tensor) is present when the vaults served
        blocks; otherwise the prefix is a view of the hot entry.
        """
        hot_n = plan.hot_tokens
        states: dict[int, StateSnapshot] = {}
        if entry is not None and hot_n:
            states = {p: s for p, s in entry.payload.states.items() if p <= plan.restored}
        if cold_state is not None:
            states[plan.restored] = cold_state
        if plan.restored == 0:
            return [], {}
        if restored_kv is None:
            assert entry is not None
            return [(k[:, :, :hot_n], v[:, :, :hot_n]) for k, v in entry.payload.kv], states
        return [(layer[0].unsqueeze(0), layer[1].unsqueeze(0)) for layer in restored_kv], states

    def _fetch_kv(
        self,
        keys: list[bytes],
        plan: RestorePlan,
        entry: HotEntry[_HotPayload] | None,
        hot_n: int,
        stats: GenerationStats,
    ) -> tuple[torch.Tensor | None, RestorePlan]:
        """One get for the planned blocks, decoded behind the hot prefix; a shorter verified run shrinks
        the plan (back to the whole hot match, ``hot_n`` tokens, if it no longer reaches past it)."""
        assert self.cluster is not None
        t = time.perf_counter()
        blobs = self.cluster.get_buffers(self.namespace, keys[plan.cold_start : plan.cold_stop], role=KV_ROLE)
        stats.network_s += time.perf_counter() - t
        stats.bytes_fetched += sum(len(b) for b in blobs if b is not None)
        t = time.perf_counter()
        prefix = entry.payload.kv if entry is not None and plan.hot_tokens else []
        result = self.blocks.decode_kv_blocks(blobs, self.device, prefix, plan.hot_tokens)
        stats.codec_s += time.perf_counter() - t
        stats.rejected_blobs += result.rejected
        if result.blocks == plan.cold_blocks:
            return result.kv, plan
        if self.layout.has_states:
            # The state snapshot sits at the planned boundary: without every block before it, no restore.
            return None, plan_restore(plan.prompt_len, self.block_size, hot_n, 0)
        shrunk = plan_restore(plan.prompt_len, self.block_size, hot_n, plan.cold_start + result.blocks)
        if shrunk.cold_blocks == 0 or result.kv is None:
            return None, shrunk
        return result.kv[:, :, :, : shrunk.restored], shrunk

    def _fetch_states(
        self, tokens: TokenArray, kv_blocks: int, hot_n: int, stats: GenerationStats
    ) -> tuple[int, StateSnapshot | None]:
        """The furthest candidate boundary whose state snapshot is in the vaults and verifies."""
        assert self.cluster is not None
        limit_blocks = min(kv_blocks, full_blocks(restore_limit(len(tokens)), self.block_size))
        candidates = [
            b
            for b in snapshot_candidates(limit_blocks, self.state_stride_blocks)
            if b * self.block_size > hot_n
        ]
        if not candidates:
            return 0, None
        group_keys = self._state_keys(tokens, candidates[0])
        groups = self.blocks.state_groups()
        for b in candidates:
            t = time.perf_counter()
            blobs = self.cluster.get_buffers(
                self.namespace, [group_keys[g][b - 1] for g in groups], role=STATE_ROLE
            )
            stats.network_s += time.perf_counter() - t
            stats.bytes_fetched += sum(len(x) for x in blobs if x is not None)
            if any(x is None for x in blobs):
                continue
            t = time.perf_counter()
            snap = self.blocks.decode_states(
                dict(zip(groups, blobs, strict=True)), b * self.block_size, self.device
            )
            stats.codec_s += time.perf_counter() - t
            if snap is not None:
                return b, snap
            stats.rejected_blobs += 1
        return 0, None

    # --------------------------------------------------------------------------------------- store

    def _on_evict(self, entry: HotEntry[_HotPayload]) -> None:
        if self.cluster is None:
            return
        self._worker.submit(functools.partial(self._store, entry.tokens, entry.payload))

    def _store(self, tokens: TokenArray, payload: _HotPayload) -> None:
        """Ship an evicted entry's full blocks (and block-boundary snapshots) the vaults lack."""
        assert self.cluster is not None
        n_blocks = full_blocks(len(tokens), self.block_size)
        if self.layout.has_kv and n_blocks > payload.cold_blocks:
            keys = self._kv_keys(tokens, n_blocks)
            blobs = (
                (keys[i], self.blocks.encode_kv_block(payload.kv, i))
                for i in range(payload.cold_blocks, n_blocks)
            )
            for batch in byte_batches(blobs, self.put_batch_bytes):
                self._put(batch, KV_ROLE)
        positions = sorted(
            p
            for p in payload.states
            if p % self.block_size == 0
            and 0 < p <= n_blocks * self.block_size
            and p not in payload.cold_states
        )
        if positions:
            group_keys = self._state_keys(tokens, positions[-1] // self.block_size)
            items: dict[bytes, bytes] = {}
            for p in positions:
                for group, blob in self.blocks.encode_states(payload.states[p], p).items():
                    items[group_keys[group][p // self.block_size - 1]] = blob
            self._put(items, STATE_ROLE)

    def _put(self, items: dict[bytes, bytes], role: str) -> None:
        assert self.cluster is not None
        acked = self.cluster.put(self.namespace, items, role=role)
        self.stored_blobs += acked
        self.stored_bytes += sum(len(b) for b in items.values())
        if acked < len(items):
            logger.info("%s: %d of %d blobs acknowledged", role, acked, len(items))


__all__ = ["ClusterLike", "GenerationStats", "TieredSession", "weights_fingerprint"]
