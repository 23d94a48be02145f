"""Where a block lives in the vaults: namespaces per stream and rank, and the block keys of a request.

Two things are kept apart on purpose:

- the *vault namespace* of a stream: model, fingerprint of the KV-shaping config, KV dtype, codec, the
  connector's block layout plus the stream (``g0.kv0``, ``g1.state1`` ...), TP/PP rank and world, and the
  tenant. Scheduler and workers compute it independently from the same configuration;
- the *block keys*, computed by the scheduler only: vLLM's own ``request.block_hashes`` moved into our
  keyspace (:func:`tierkv.keys.wrap_engine_hashes`) when they are reproducible across processes, else
  tierkv's chained SHA-256 over the token ids (:func:`tierkv.keys.block_keys`). The hash scheme is folded
  into the keys, so engines hashing differently never share blocks.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tierkv.connectors.vllm.plan import Stream, Topology
from tierkv.keys import Namespace, block_keys, wrap_engine_hashes

logger = logging.getLogger(__name__)

LAYOUT_PREFIX = "vllm-logical-v1"
"""Version of the connector's blob layout (see :mod:`tierkv.connectors.vllm.layout`)."""

ENGINE = "engine"
TIERKV = "tierkv"


@dataclass(frozen=True)
class Identity:
    """The base namespace of one deployment (rank 0, no stream) and its parallel world."""

    base: Namespace

    def stream_namespace(self, stream: Stream, tp_rank: int = 0, pp_rank: int = 0) -> bytes:
        ns = dataclasses.replace(
            self.base, layout=f"{self.base.layout}/{stream.tag}", tp_rank=tp_rank, pp_rank=pp_rank
        )
        return ns.digest

    def all_ranks(self, stream: Stream) -> tuple[bytes, ...]:
        """The namespace of ``stream`` on every TP/PP rank (a hit must exist on all of them)."""
        return tuple(
            self.stream_namespace(stream, tp, pp)
            for pp in range(self.base.pp_world)
            for tp in range(self.base.tp_world)
        )


def make_identity(
    hf_config: dict[str, Any],
    *,
    model: str,
    dtype: str,
    codec: str,
    block_size: int,
    kv_layout: str,
    tp_world: int,
    pp_world: int,
    tenant: str = "",
) -> Identity:
    base = Namespace.from_config(
        hf_config,
        model=model,
        dtype=dtype,
        codec=codec,
        block_size=block_size,
        layout=f"{LAYOUT_PREFIX}/{kv_layout or 'default'}/bs{block_size}",
        tp_world=tp_world,
        pp_world=pp_world,
        tenant=tenant,
    )
    return Identity(base)


def choose_hash_scheme(mode: str, algo: str, hashseed_env: str | None) -> str:
    """``engine:<algo>:<seed>`` when vLLM's block hashes are reproducible across processes, else ``tierkv``.

    vLLM derives its first parent hash (NONE_HASH) from PYTHONHASHSEED when set, else from a fixed seed
    for the sha256 variants and from random bytes for the xxhash ones; the seed is part of the scheme.
    """
    reproducible = algo.startswith("sha256") or hashseed_env is not None
    if mode == TIERKV or (mode == "auto" and not reproducible):
        return TIERKV
    if not reproducible:
        logger.warning("hash=engine with %s and no PYTHONHASHSEED: keys will not match across restarts", algo)
    return f"{ENGINE}:{algo}:{hashseed_env if hashseed_env is not None else 'default'}"


class KeyBook:
    """Block keys per request, extended incrementally as vLLM appends block hashes or tokens."""

    def __init__(self, identity: Identity, topology: Topology, scheme: str) -> None:
        self.topology = topology
        self.scheme = scheme
        self.namespace = dataclasses.replace(identity.base, extra={**identity.base.extra, "hash": scheme})
        self._cache: dict[str, list[bytes]] = {}

    @property
    def uses_engine_hashes(self) -> bool:
        return self.scheme.startswith(ENGINE)

    def keys(self, request: Any) -> list[bytes]:
        """One key per full block of the request (prompt and output), in order."""
        have = self._cache.setdefault(request.request_id, [])
        if self.uses_engine_hashes:
            hashes: Sequence[bytes] = request.block_hashes
            have.extend(wrap_engine_hashes(self.namespace, self.topology.block_keys(hashes, len(have))))
            return have[: len(hashes) // self.topology.hashes_per_block]
        if getattr(request, "mm_features", None):
            return []
        bs = self.topology.block_size
        tokens = request.all_token_ids
        wanted = len(tokens) // bs
        if wanted > len(have):
            new = block_keys(
                list(tokens[len(have) * bs : wanted * bs]),
                bs,
                extra=_extra(request),
                parent=have[-1] if have else None,
                namespace=None if have else self.namespace,
            )
            have.extend(new)
        return have[:wanted]

    def forget(self, req_id: str) -> None:
        self._cache.pop(req_id, None)


def _extra(request: Any) -> bytes:
    """What besides tokens makes a block's KV differ (vLLM folds the same into its own hashes)."""
    salt = getattr(request, "cache_salt", None) or ""
    lora = getattr(request, "lora_request", None)
    lora_name = getattr(lora, "lora_name", "") if lora is not None else ""
    return f"salt={salt};lora={lora_name}".encode()


__all__ = ["ENGINE", "LAYOUT_PREFIX", "TIERKV", "Identity", "KeyBook", "choose_hash_scheme", "make_identity"]
