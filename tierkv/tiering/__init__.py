"""The cold-tier pipeline every engine hook uses: store blocks in the vaults, restore them, verified.

Modelled on vLLM's ``kv_offload`` split: the *storage* (``Storage``) moves bytes, the *pipeline*
(``ColdTier``) turns arrays into verified blobs and back, and the *hook* (``tierkv.connectors.<engine>``)
knows its engine's cache layout and when to store or restore — nothing else.

What a storage answers a put: a :class:`PutResult` (what the vaults' replies said they stored, refused
and hold fewer copies of), never what was merely sent.

What a hook provides
    - a :class:`Storage`: ``open_cluster(config)`` for the vaults of tierkv.toml, wrapped in
      :class:`LazyStorage` when connections must wait for the engine to fork; :class:`MemoryStorage` in
      tests;
    - an :class:`Arrays` for its tensor type: :class:`tierkv.tiering.tensors.TorchArrays` (torch) or
      :class:`NumpyArrays` (numpy, and MLX through numpy);
    - one :class:`StreamSpec` per kind of blob: namespace digest (:class:`tierkv.keys.Namespace`), layer
      group, KV codec. Role and codec follow from it (states always raw: :func:`codec_for`);
    - block keys (:func:`tierkv.keys.block_keys`, or the engine's own chained hashes inside the
      namespace) and, for restores, the expected header of each blob (``spec.expect(shape, tokens)``);
    - its cache layout: copying a block out (an array per block) and the slots decoded blocks go into.

What the pipeline does, in this order
    1. set-up (the hook's thread, once): ``tier = ColdTier(storage, arrays)``; no I/O yet;
    2. plan (the thread that serves the request): :mod:`tierkv.tiering.positions` bounds a restore
       (``restore_limit``, ``full_blocks``, ``snapshot_candidates``); ``tier.lookup(spec, keys)`` gives
       the leading run the vaults hold;
    3. restore (the same thread, or the hook's load thread): ``tier.restore(spec, keys, expect, out)``
       — one get, every blob verified against ``expect`` and decoded into ``out(n)`` (or, for ``raw``
       blobs, handed to ``place(i, values)`` as a view of the received bytes, which the hook copies
       straight into its cache; or, with ``into=buffer`` and :class:`RowArrays`, all verified first and
       decoded into the buffer's rows together), rejects counted and deleted from the vaults; the
       :class:`Restored` result says which blocks arrived (``decoded``, ``leading``, ``failed``) and the
       hook writes them into its cache or reports the failed ones;
    4. store (never on the serving path: a :class:`BoundedWorker` or the hook's own bounded pool):
       blocks the engine may reuse are copied out on the engine's thread first, then
       ``tier.store(spec, blocks)`` encodes them lazily, puts byte-bounded batches
       (:func:`byte_batches`) and returns a :class:`StoreTally`; ``snapshot_boundaries`` says where a
       hybrid model's state is snapshotted;
    5. shutdown: drain the background work, then ``storage.close()``.

A vault failure is a miss at every step (no exception reaches the engine), and nothing is restored that
did not verify.

What a new engine hook writes (``tierkv/connectors/<engine>/``)
    ``layout.py`` (its cache layout: block shapes and dtypes, copying blocks out and back in),
    the driver (``session.py`` for a generate loop, or the engine's connector class: when to look up,
    restore and store), ``__init__.py`` (its public names) and ``tests/connectors/<engine>/``. Nothing
    in this package or in ``tierkv.client``; a hook never imports the client or the wire format. If a
    hook needs more, the pipeline is missing something: add it here, once.
"""

from tierkv.records import PutResult, Rejection
from tierkv.tiering.arrays import Arrays, NumpyArrays, RowArrays, ViewingArrays
from tierkv.tiering.background import BoundedWorker
from tierkv.tiering.batches import byte_batches
from tierkv.tiering.checks import at_least, one_of
from tierkv.tiering.memory import Faults, MemoryStorage
from tierkv.tiering.pipeline import MAX_PUT_BYTES, Block, ColdTier, Place, Restored, StoreTally
from tierkv.tiering.positions import full_blocks, restore_limit, snapshot_boundaries, snapshot_candidates
from tierkv.tiering.spec import STATE_CODEC, Expect, StreamSpec, codec_for
from tierkv.tiering.storage import Hints, LazyStorage, Storage, open_cluster

__all__ = [
    "MAX_PUT_BYTES",
    "STATE_CODEC",
    "Arrays",
    "Block",
    "BoundedWorker",
    "ColdTier",
    "Expect",
    "Faults",
    "Hints",
    "LazyStorage",
    "MemoryStorage",
    "NumpyArrays",
    "Place",
    "PutResult",
    "Rejection",
    "Restored",
    "RowArrays",
    "Storage",
    "StoreTally",
    "StreamSpec",
    "ViewingArrays",
    "at_least",
    "byte_batches",
    "codec_for",
    "full_blocks",
    "one_of",
    "open_cluster",
    "restore_limit",
    "snapshot_boundaries",
    "snapshot_candidates",
]
