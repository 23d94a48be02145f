"""What the vLLM connector stores and restores, as pure functions of block ids, hashes and token counts.

Nothing here imports vLLM or torch, so every rule is unit-tested in the main environment:

- a restore never covers the last prompt token (vLLM needs logits for it) and starts where the engine's
  own prefix cache stopped; it is measured in whole blocks of the model's KV-cache groups;
- a hit is claimed only up to the last block that every restored group holds in the vaults: KV blocks for
  every position of attention groups, and, for recurrent (Mamba / linear-attention) groups, the state
  snapshot at the hit's last block boundary;
- a group that cannot be restored exactly (sliding window, non-aligned Mamba, block sizes that differ
  across groups ...) disables restores for the whole model: the connector then claims nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tierkv.codec import LayerGroup
from tierkv.retention import BlockMeta
from tierkv.tiering.positions import restore_limit

logger = logging.getLogger(__name__)

KV = "kv"
STATE = "state"
NULL_BLOCK = 0
"""vLLM's placeholder block id (skipped sliding-window / Mamba positions); never stored or loaded."""


@dataclass(frozen=True)
class Stream:
    """One separately keyed series of blobs: a group's KV blocks or its recurrent-state pages."""

    group: int
    kind: str
    index: int
    layer_group: LayerGroup

    @property
    def role(self) -> str:
        return self.layer_group.role

    @property
    def tag(self) -> str:
        """Stable name of the stream inside a namespace, e.g. ``g0.kv0`` or ``g1.state1``."""
        return f"g{self.group}.{self.kind}{self.index}"


@dataclass(frozen=True)
class GroupPlan:
    """One vLLM KV-cache group as the connector handles it."""

    index: int
    kind: str
    block_size: int
    layer_names: tuple[str, ...]

    @property
    def streams(self) -> tuple[Stream, ...]:
        """KV groups store their KV blocks; recurrent groups their per-block state pages (conv and SSM)."""
        if self.kind == KV:
            return (Stream(self.index, KV, 0, LayerGroup.ATTENTION),)
        return (Stream(self.index, STATE, 0, LayerGroup.SSM),)


@dataclass(frozen=True)
class Topology:
    """The groups of one model and the common block size a restore is counted in.

    ``unsupported`` is the reason restores are disabled ("" when they are not); stores of the supported
    groups still happen so that nothing depends on this decision being permanent.
    """

    groups: tuple[GroupPlan, ...]
    block_size: int
    hash_block_size: int
    unsupported: str = ""

    @property
    def restorable(self) -> bool:
        return not self.unsupported and bool(self.groups)

    @property
    def kv_groups(self) -> tuple[GroupPlan, ...]:
        return tuple(g for g in self.groups if g.kind == KV)

    @property
    def state_groups(self) -> tuple[GroupPlan, ...]:
        return tuple(g for g in self.groups if g.kind == STATE)

    @property
    def streams(self) -> tuple[Stream, ...]:
        return tuple(s for g in self.groups for s in g.streams)

    @property
    def hashes_per_block(self) -> int:
        return self.block_size // self.hash_block_size

    def block_keys(self, hashes: Sequence[bytes], start: int = 0) -> list[bytes]:
        """The engine hash of each full block from block ``start`` on.

        The chained hash at a block's last hash boundary covers the block's whole prefix.
        """
        r = self.hashes_per_block
        return [hashes[(j + 1) * r - 1] for j in range(start, len(hashes) // r)]


def make_topology(groups: Sequence[GroupPlan], skipped: Sequence[str], hash_block_size: int) -> Topology:
    """Check that ``groups`` can be restored exactly; ``skipped`` names groups the connector cannot handle."""
    sizes = {g.block_size for g in groups}
    block_size = max(sizes) if sizes else hash_block_size
    reason = ""
    if skipped:
        reason = "unsupported KV-cache groups: " + "; ".join(skipped)
    elif not groups:
        reason = "no KV-cache group to restore"
    elif len(sizes) != 1:
        reason = f"KV-cache groups use different block sizes {sorted(sizes)}"
    elif hash_block_size < 1 or block_size % hash_block_size:
        reason = f"block size {block_size} is not a multiple of the hash block size {hash_block_size}"
    if reason:
        logger.warning("tierkv restores disabled: %s", reason)
    return Topology(tuple(groups), block_size, max(hash_block_size, 1), reason)


@dataclass(frozen=True)
class Window:
    """Blocks ``[start, stop)`` of a request that a restore could cover."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return max(self.stop - self.start, 0)


def restore_window(num_tokens: int, num_computed: int, block_size: int, num_keys: int) -> Window:
    """The blocks a restore may cover: after the local hit, before the last token, with a key each.

    A local hit that ends inside a block (possible when the engine's hash blocks are finer than the
    connector's) gives an empty window: restoring the block would overwrite computed tokens.
    """
    if num_computed % block_size:
        return Window(0, 0)
    start = num_computed // block_size
    stop = min(restore_limit(num_tokens) // block_size, num_keys)
    return Window(start, max(start, stop))


def claimed_tokens(window: Window, hit_blocks: int, block_size: int) -> int:
    """Tokens beyond the local hit that ``hit_blocks`` leading blocks of ``window`` give."""
    return max(min(hit_blocks, window.size), 0) * block_size


def state_candidates(window: Window, kv_hits: int, max_probes: int) -> list[int]:
    """Block counts (from the window's start) to try, best first, for a recurrent state snapshot.

    The state must exist at the hit's last block; a shorter hit ends at an earlier boundary.
    """
    top = min(kv_hits, window.size)
    return list(range(top, max(top - max_probes, 0), -1))


@dataclass(frozen=True)
class BlockRef:
    """One block of one group: where it lives in the paged cache and the key it is stored under."""

    group: int
    position: int
    block_id: int
    key: bytes


@dataclass(frozen=True)
class LoadJob:
    """Blocks to fetch into a request's freshly allocated blocks (asynchronously).

    ``broken`` marks a load that cannot be done (vLLM allocated no block where one was needed): its
    blocks are reported as failed without being fetched. ``sync`` loads run inside the step, before the
    forward that uses them, and are not reported as finished transfers.
    """

    req_id: str
    refs: tuple[BlockRef, ...]
    broken: bool = False
    sync: bool = False


@dataclass(frozen=True)
class StoreJob:
    """Blocks to ship to the vaults.

    ``req_id`` is set for a finished request whose blocks vLLM keeps until the worker reports it done
    (``snapshot`` False); state snapshots offered mid-flight are copied within the step (``snapshot``
    True) because vLLM does not keep those blocks for us. ``meta`` is the retention metadata of the
    blocks by key when the request came with a prompt layout (None: stored untagged). ``held`` jobs
    carry evicted blocks the scheduler references until the workers report the job in their worker
    metadata (:mod:`tierkv.connectors.vllm.eviction`); vLLM never sees their ``req_id``.
    """

    req_id: str
    refs: tuple[BlockRef, ...]
    snapshot: bool = False
    held: bool = False
    meta: Mapping[bytes, BlockMeta] | None = field(default=None, compare=False)


@dataclass
class StepJobs:
    """Everything the workers must do for one engine step."""

    loads: list[LoadJob] = field(default_factory=list)
    stores: list[StoreJob] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.loads or self.stores)


def load_refs(
    topology: Topology, keys: Sequence[bytes], block_ids: Sequence[Sequence[int]], window: Window
) -> list[BlockRef] | None:
    """The blocks a restore of ``window`` writes: every position of KV groups, the last one of state groups.

    None when vLLM did not allocate a real block where one is needed (the restore is then not done).
    """
    refs: list[BlockRef] = []
    if window.size == 0:
        return refs
    for group in topology.groups:
        ids = block_ids[group.index]
        positions = range(window.start, window.stop) if group.kind == KV else (window.stop - 1,)
        for pos in positions:
            if pos >= len(ids) or ids[pos] == NULL_BLOCK or pos >= len(keys):
                return None
            refs.append(BlockRef(group.index, pos, ids[pos], keys[pos]))
    return refs


def finished_refs(
    topology: Topology, keys: Sequence[bytes], block_ids: Sequence[Sequence[int]], num_computed: int
) -> list[BlockRef]:
    """KV blocks of a finished request worth storing: full, computed, real, in position order."""
    full = min(num_computed // topology.block_size, len(keys))
    refs: list[BlockRef] = []
    for group in topology.kv_groups:
        ids = block_ids[group.index] if group.index < len(block_ids) else []
        for pos in range(min(full, len(ids))):
            if ids[pos] != NULL_BLOCK:
                refs.append(BlockRef(group.index, pos, ids[pos], keys[pos]))
    return refs


def snapshot_refs(
    topology: Topology, keys: Sequence[bytes], offers: Sequence[tuple[int, int, int]]
) -> list[BlockRef]:
    """State blocks vLLM offers at block boundaries (``(group, block_id, boundary_tokens)``) with their keys.

    Offers that do not end on a block boundary, or lie beyond the hashed tokens, cannot be keyed and
    are dropped.
    """
    state_groups = {g.index for g in topology.state_groups}
    refs: list[BlockRef] = []
    for group, block_id, boundary in offers:
        if group not in state_groups or block_id == NULL_BLOCK or boundary <= 0:
            continue
        if boundary % topology.block_size:
            continue
        pos = boundary // topology.block_size - 1
        if pos < len(keys):
            refs.append(BlockRef(group, pos, block_id, keys[pos]))
    return refs


__all__ = [
    "KV",
    "NULL_BLOCK",
    "STATE",
    "BlockRef",
    "GroupPlan",
    "LoadJob",
    "StepJobs",
    "StoreJob",
    "Stream",
    "Topology",
    "Window",
    "claimed_tokens",
    "finished_refs",
    "load_refs",
    "make_topology",
    "restore_window",
    "snapshot_refs",
    "state_candidates",
]
