"""The mlx-lm hook: look up before ``generate``, store after, over the shared cold-tier pipeline.

::

    tier = MlxTier(model, open_cluster(config), model_id="mlx-community/...")
    prepared = tier.prepare(prompt_tokens)          # longest stored prefix, restored into a fresh cache
    for response in stream_generate(model, tokenizer, prepared.remaining, prompt_cache=prepared.cache):
        ...
    tier.store(prepared, generated_tokens)          # ship what the vaults lack
    tier.store(prepared, generated_tokens, layout=[{"tokens": [0, 512], "source": "axioms"}])  # tagged

Full-attention layers are restored block by block (any stored prefix is usable); models with sliding
windows or recurrent state also need a snapshot at the restore boundary, so :meth:`MlxTier.prepare`
prefills such models up to the last block boundary of the prompt itself, taking a snapshot every
``snapshot_every`` blocks and at that boundary, and :meth:`MlxTier.store` ships them. A hit is claimed
only where every KV block before the boundary and its snapshot arrive and verify. Anything that fails
— a vault down, a corrupt blob — is a miss: the tokens are recomputed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Final

import mlx.core as mx
import numpy as np
import numpy.typing as npt
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from tierkv.codec import DTYPES, Buffer, LayerGroup
from tierkv.connectors.mlx.layout import (
    LayerSpec,
    MlxLayout,
    blob_dtype,
    kv_blocks,
    kv_states,
    manifest,
    parse_manifest,
    probe,
    snapshot_arrays,
    snapshot_states,
)
from tierkv.connectors.mlx.states import LayerState, read_state, rebuild, to_numpy
from tierkv.keys import Namespace, block_keys
from tierkv.retention import BlockMeta, Layout, Retention, chain_meta
from tierkv.tiering.arrays import NumpyArrays
from tierkv.tiering.pipeline import Block, ColdTier, Restored, StoreTally
from tierkv.tiering.spec import Expect, StreamSpec
from tierkv.tiering.storage import Storage

log = logging.getLogger(__name__)

_SNAPSHOT_TAG: Final = b"tierkv/mlx-snapshot/v1"
_PART_TAG: Final = b"tierkv/mlx-snapshot-part/v1\x00"
_U32: Final = struct.Struct("<I")
PREFILL_STEP: Final = 2048
"""Largest prefill chunk the hook runs itself (mlx-lm's own default step)."""
SNAPSHOT_TRIES: Final = 3
"""Snapshot boundaries tried, furthest first, before a restore gives up."""


class NumpyBlobs:
    """The pipeline's ``Arrays`` for numpy arrays of any blob dtype: :class:`NumpyArrays` with the dtype
    taken from each array (``uint16`` meaning bfloat16), as one model's cache mixes dtypes."""

    def encode(self, block: npt.NDArray[Any], codec: str, tokens: int, layer_group: LayerGroup) -> bytes:
        return NumpyArrays(blob_dtype(block)).encode(block, codec, tokens, layer_group)

    def decode_into(self, blob: Buffer, out: npt.NDArray[Any], expect: Expect) -> None:
        NumpyArrays(blob_dtype(out)).decode_into(blob, out, expect)


class ManifestBlobs(NumpyBlobs):
    """Decodes snapshot manifests and refuses (as corrupt) one that does not fit the layout."""

    def __init__(self, layout: MlxLayout) -> None:
        self.layout = layout

    def decode_into(self, blob: Buffer, out: npt.NDArray[Any], expect: Expect) -> None:
        super().decode_into(blob, out, expect)
        if expect.tokens is None:
            raise ValueError("a manifest is decoded against the tokens it covers")
        parse_manifest(self.layout, out, expect.tokens)


@dataclass
class Prepared:
    """A prompt made ready for ``generate``: ``cache`` holds the first ``processed`` tokens.

    ``restored`` of them came from the vaults; ``snapshots`` are the boundary states the hook took
    while prefilling (position → snapshot layers' states), for :meth:`MlxTier.store`.
    """

    tokens: list[int]
    cache: list[Any]
    restored: int = 0
    processed: int = 0
    snapshots: dict[int, list[LayerState]] = field(default_factory=dict)
    fetched_bytes: int = 0
    rejected: int = 0
    get_s: float = 0.0
    decode_s: float = 0.0
    inject_s: float = 0.0

    def count(self, restored: Restored) -> None:
        """Add one pipeline restore's bytes, rejects and times."""
        self.fetched_bytes += restored.fetched_bytes
        self.rejected += restored.rejected
        self.get_s += restored.get_s
        self.decode_s += restored.decode_s

    @property
    def remaining(self) -> Any:
        """The prompt tokens still to compute, as the ``mx.array`` ``generate_step`` takes."""
        return mx.array(self.tokens[self.processed :])


def weights_fingerprint(model: Any, sample: int = 256) -> str:
    """A cheap identity of a model's weights: config plus the first and last values of every tensor.

    Two models with one config but other weights (fine-tunes, random inits) get different namespaces.
    """
    h = hashlib.sha256(repr(_config(model)).encode())
    for name, p in tree_flatten(model.parameters()):
        flat = p.reshape(-1)
        h.update(name.encode())
        for part in (flat[:sample], flat[-sample:]):
            h.update(to_numpy(part).tobytes())
    return h.hexdigest()


def _config(model: Any) -> dict[str, Any]:
    args = getattr(model, "args", None)
    return asdict(args) if is_dataclass(args) and not isinstance(args, type) else {}


def part_key(base: bytes, index: int) -> bytes:
    """Key of part ``index`` of the snapshot whose chained key is ``base`` (0 is its manifest)."""
    return hashlib.sha256(_PART_TAG + base + _U32.pack(index)).digest()


class MlxTier:
    """Cold tier for one mlx-lm model: :meth:`prepare` before generation, :meth:`store` after.

    ``storage`` is any :class:`~tierkv.tiering.storage.Storage` (``open_cluster(config)`` for the
    vaults). ``model_id`` names the weights (a hub id or path); left out, a fingerprint of the weights
    is used. ``codec`` is the KV codec (``raw`` or ``int8``); snapshots and quantized KV are always raw.
    ``retention`` is the class table a prompt layout given to :meth:`store` is tagged by. ``make_cache``
    builds an empty prompt cache for the model (mlx-lm's ``make_prompt_cache`` unless given): pass the
    engine's own when it differs, e.g. ``QuantizedKVCache`` layers, which are stored bit for bit.
    """

    def __init__(
        self,
        model: Any,
        storage: Storage,
        *,
        model_id: str | None = None,
        block_size: int = 16,
        codec: str = "raw",
        tenant: str = "",
        snapshot_every: int = 4,
        retention: Retention | None = None,
        make_cache: Callable[[Any], list[Any]] | None = None,
    ) -> None:
        if block_size < 2 or snapshot_every < 1:
            raise ValueError(
                f"block_size must be >= 2 and snapshot_every >= 1, got {block_size}, {snapshot_every}"
            )
        self.model = model
        self.block_size = block_size
        self.snapshot_every = snapshot_every
        self.retention = retention or Retention()
        self.make_cache = make_cache or make_prompt_cache
        self.layout = probe(model, self.make_cache(model))
        if self.layout.quantized and codec != "raw":
            log.info("quantized KV layers are stored as they are: the %s codec does not apply", codec)
            codec = "raw"
        dtype = self.layout.kv_dtype or self.layout.state_dtype
        self.namespace = Namespace.from_config(
            _config(model),
            model=model_id or f"mlx-weights:{weights_fingerprint(model)}",
            dtype=dtype,
            codec=codec,
            block_size=block_size,
            layout=self.layout.describe(),
            tenant=tenant,
        )
        ns = self.namespace.digest
        self.kv_spec = StreamSpec(ns, LayerGroup.ATTENTION, kv_codec=codec)
        self.snap_spec = StreamSpec(ns, LayerGroup.SSM, kv_codec=codec)
        self.blocks = ColdTier(storage, NumpyBlobs())
        self.manifests = ColdTier(storage, ManifestBlobs(self.layout))

    # ----------------------------------------------------------------------------------------- keys

    def kv_keys(self, tokens: Sequence[int], blocks: int) -> list[bytes]:
        return block_keys(list(tokens[: blocks * self.block_size]), self.block_size, namespace=self.namespace)

    def snapshot_keys(self, tokens: Sequence[int], blocks: int) -> list[bytes]:
        """The chained key of each block boundary's snapshot (a chain apart from the KV blocks')."""
        ids = list(tokens[: blocks * self.block_size])
        return block_keys(ids, self.block_size, extra=_SNAPSHOT_TAG, namespace=self.namespace)

    # -------------------------------------------------------------------------------------- prepare

    def prepare(self, prompt: Sequence[int] | Any) -> Prepared:
        """A fresh prompt cache holding the longest usable stored prefix of ``prompt`` (token ids).

        At least one token is always left to compute (``generate`` needs the logits of the last one).
        Models with snapshot layers are then prefilled up to the prompt's last block boundary.
        """
        prepared = self.restore(prompt)
        if self.layout.has_snapshots:
            self._prefill_to_boundaries(prepared, self.reachable(len(prepared.tokens)))
        return prepared

    def reachable(self, prompt_tokens: int) -> int:
        """The most tokens of a prompt a restore can give: whole blocks, short of its last token."""
        return (prompt_tokens - 1) // self.block_size * self.block_size

    def restore(self, prompt: Sequence[int] | Any) -> Prepared:
        """Like :meth:`prepare` without the prefill: only what the vaults give back is in the cache."""
        tokens = [int(t) for t in (prompt.tolist() if hasattr(prompt, "tolist") else prompt)]
        prepared = Prepared(tokens, self.make_cache(self.model))
        limit = (len(tokens) - 1) // self.block_size
        if limit > 0:
            self._restore(prepared, limit)
        return prepared

    def _restore(self, prepared: Prepared, limit: int) -> None:
        kv_keys = self.kv_keys(prepared.tokens, limit)
        available = self.blocks.lookup(self.kv_spec, kv_keys) if self.layout.has_kv else limit
        for _ in range(SNAPSHOT_TRIES):
            boundary, snapshot = self._find_snapshot(prepared, available)
            if boundary == 0:
                return
            kv = self._fetch_kv(prepared, kv_keys[:boundary])
            got = (kv[0].ints[0] // self.block_size if kv else 0) if self.layout.has_kv else boundary
            if got == boundary or not self.layout.has_snapshots:
                self._assemble(prepared, got, kv, snapshot)
                return
            available = got

    def _find_snapshot(self, prepared: Prepared, available: int) -> tuple[int, list[LayerState]]:
        """The furthest boundary (<= ``available`` blocks) whose snapshot arrives whole and verifies."""
        if not self.layout.has_snapshots or available == 0:
            return available, []
        chain = self.snapshot_keys(prepared.tokens, available)
        candidates = list(range(available, 0, -1))
        size = self.layout.manifest_len
        metas = np.empty((len(candidates), size), np.float32)
        expects = [self.snap_spec.expect((size,), b * self.block_size, "float32") for b in candidates]
        found = self.manifests.restore(
            self.snap_spec, [part_key(chain[b - 1], 0) for b in candidates], expects, metas.__getitem__
        )
        prepared.count(found)
        for n, i in enumerate(found.decoded[:SNAPSHOT_TRIES]):
            b = candidates[i]
            specs = parse_manifest(self.layout, metas[n], b * self.block_size)
            states = self._fetch_snapshot(prepared, chain[b - 1], specs, b * self.block_size)
            if states is not None:
                return b, states
        return 0, []

    def _fetch_snapshot(
        self, prepared: Prepared, base: bytes, specs: Sequence[LayerSpec], position: int
    ) -> list[LayerState] | None:
        wanted = [a for s in specs for a in s.arrays]
        arrays = [a.empty() for a in wanted]
        keys = [part_key(base, j + 1) for j in range(len(wanted))]
        expects = [self.snap_spec.expect(a.shape, position, a.dtype) for a in wanted]
        got = self.blocks.restore(self.snap_spec, keys, expects, arrays.__getitem__, leading_only=True)
        prepared.count(got)
        return snapshot_states(specs, arrays) if got.leading == len(wanted) else None

    def _fetch_kv(self, prepared: Prepared, keys: Sequence[bytes]) -> list[LayerState]:
        """The leading run of KV blocks that arrives and verifies, as per-layer states (empty: none)."""
        if not self.layout.has_kv or not keys:
            return []
        shape = self.layout.kv_block_shape(self.block_size)
        buf = np.empty((len(keys), *shape), DTYPES[self.layout.kv_dtype].storage)
        expect = self.kv_spec.expect(shape, self.block_size, self.layout.kv_dtype)
        got = self.blocks.restore(self.kv_spec, keys, expect, buf.__getitem__, leading_only=True)
        prepared.count(got)
        return kv_states(self.layout, buf[: got.leading]) if got.leading else []

    def _assemble(
        self, prepared: Prepared, blocks: int, kv: Sequence[LayerState], snapshot: Sequence[LayerState]
    ) -> None:
        if blocks == 0:
            return
        layers = dict(zip(self.layout.kv_layers, kv, strict=True))
        layers.update({s.index: st for s, st in zip(self.layout.snapshots, snapshot, strict=True)})
        start = time.perf_counter()
        prepared.cache = [rebuild(t, layers[i]) for i, t in enumerate(prepared.cache)]
        mx.eval([c.state for c in prepared.cache])
        prepared.inject_s += time.perf_counter() - start
        prepared.restored = prepared.processed = blocks * self.block_size

    def _prefill_to_boundaries(self, prepared: Prepared, last: int) -> None:
        """Run the prompt up to ``last`` through the cache, snapshotting at the chosen boundaries."""
        every = self.snapshot_every * self.block_size
        stops = sorted({p for p in range(every, last, every) if p > prepared.processed} | {last})
        for stop in stops:
            if stop <= prepared.processed:
                continue
            for s in range(prepared.processed, stop, PREFILL_STEP):
                chunk = mx.array(prepared.tokens[s : min(s + PREFILL_STEP, stop)])
                self.model(chunk[None], cache=prepared.cache)
                mx.eval([c.state for c in prepared.cache])
            prepared.processed = stop
            prepared.snapshots[stop] = [read_state(prepared.cache[s.index]) for s in self.layout.snapshots]

    # ---------------------------------------------------------------------------------------- store

    def store(
        self, prepared: Prepared, generated: Sequence[int] = (), *, layout: Layout | None = None
    ) -> StoreTally:
        """Ship the KV blocks the vaults lack and the snapshots taken in :meth:`prepare`.

        ``generated`` are the tokens ``generate`` produced after the prompt; the blocks they fill
        are stored as far as the cache holds them. ``layout`` (token spans of the prompt, as for
        :func:`tierkv.retention.block_meta`) tags the stored blocks, the generated tokens as
        ``generation``; a snapshot takes the tag of the block it ends. Without it nothing is tagged.
        """
        tokens = prepared.tokens + [int(t) for t in generated]
        tally = StoreTally()
        meta = self._meta(layout, tokens, len(prepared.tokens))
        if self.layout.has_kv:
            tally.add(self._store_kv(prepared.cache, tokens, meta))
        snaps = {p: s for p, s in prepared.snapshots.items() if p > prepared.restored}
        if snaps:
            chain = self.snapshot_keys(tokens, max(snaps) // self.block_size)
            items = list(self._snapshot_blocks(chain, snaps))
            tally.add(self.blocks.store(self.snap_spec, items, self._snapshot_meta(meta, items)))
        return tally

    def _meta(
        self, layout: Layout | None, tokens: Sequence[int], prompt: int
    ) -> dict[bytes, BlockMeta] | None:
        """Each full block's metadata by KV key, in chain order, with its token ids under ``[retention]
        warm_tokens`` (None without a layout or the setting)."""
        if layout is None and not self.retention.warm_tokens:
            return None
        keys = self.kv_keys(tokens, len(tokens) // self.block_size)
        return chain_meta(
            keys, self.block_size, self.retention, layout=layout, tokens=tokens, prompt_tokens=prompt
        )

    def _snapshot_meta(
        self, meta: Mapping[bytes, BlockMeta] | None, items: Sequence[Block[Any]]
    ) -> dict[bytes, BlockMeta] | None:
        """Every part of a snapshot with the metadata of the block it ends, parentless: the parts form no
        chain, and a parent in the KV chain would count as sharing there."""
        if meta is None:
            return None
        keys = list(meta)
        return {
            key: dataclasses.replace(meta[keys[position // self.block_size - 1]], parent=b"", tokens=())
            for key, _, position in items
        }

    def store_cache(
        self, tokens: Sequence[int], cache: Sequence[Any], *, layout: Layout | None = None
    ) -> StoreTally:
        """Ship a filled prompt cache that this hook did not prepare (e.g. a server cache entry).

        Its KV blocks are stored as far as the cache holds ``tokens``; its snapshot layers only when
        the cache ends exactly on a block boundary (a state is never cut back), which needs a
        full-attention or sliding layer to tell how many tokens the cache holds. ``layout`` is as for
        :meth:`store` (every token is prompt here).
        """
        prepared = Prepared([int(t) for t in tokens], list(cache))
        held = self._held(cache)
        if self.layout.has_snapshots and held and held % self.block_size == 0 and held <= len(tokens):
            prepared.snapshots[held] = [read_state(cache[s.index]) for s in self.layout.snapshots]
        return self.store(prepared, layout=layout)

    def _held(self, cache: Sequence[Any]) -> int:
        """Tokens a cache holds, by its layers' offsets (0 when no layer has one or they disagree)."""
        offsets = {int(c.offset) for c in cache if hasattr(c, "offset")}
        return offsets.pop() if len(offsets) == 1 else 0

    def _store_kv(
        self, cache: Sequence[Any], tokens: Sequence[int], meta: Mapping[bytes, BlockMeta] | None
    ) -> StoreTally:
        held = min(int(cache[i].offset) for i in self.layout.kv_layers)
        n = min(held, len(tokens)) // self.block_size
        keys = self.kv_keys(tokens, n)
        have = self.blocks.lookup(self.kv_spec, keys)
        arrays = kv_blocks(self.layout, cache, have, n, self.block_size)
        items = ((keys[i], a, self.block_size) for i, a in zip(range(have, n), arrays, strict=True))
        return self.blocks.store(self.kv_spec, items, meta)

    def _snapshot_blocks(
        self, chain: Sequence[bytes], snaps: dict[int, list[LayerState]]
    ) -> Iterator[Block[npt.NDArray[Any]]]:
        for position, states in sorted(snaps.items()):
            base = chain[position // self.block_size - 1]
            yield part_key(base, 0), manifest(self.layout, states), position
            for j, array in enumerate(snapshot_arrays(states)):
                yield part_key(base, j + 1), array, position


__all__ = ["ManifestBlobs", "MlxTier", "NumpyBlobs", "Prepared", "part_key", "weights_fingerprint"]
