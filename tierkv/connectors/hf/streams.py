"""Where one model's blobs live in the vaults: its namespace, its streams and the keys of its blocks.

The namespace covers what makes a cache reusable (model identity, config, dtype, codec, block size,
cache layout, tenant); block keys chain the token ids inside it. Each state group has its own chain
(tagged), distinct from the KV chain, because it is stored once per block boundary, not per block.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from tierkv.codec import LayerGroup
from tierkv.connectors.hf.blocks import ModelBlocks
from tierkv.connectors.hf.hot import TokenArray
from tierkv.keys import Namespace, block_keys
from tierkv.tiering import StreamSpec

LAYOUT_VERSION = 1
_GROUP_TAGS = {LayerGroup.SSM: b"tierkv/ssm", LayerGroup.CONV: b"tierkv/conv"}


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


class Streams:
    """The namespace of one model's cache, its KV and state streams, and the key of every block."""

    def __init__(self, model: Any, blocks: ModelBlocks, codec: str, identity: str, tenant: str) -> None:
        self.block_size = blocks.block_size
        self.namespace = Namespace.from_config(
            model.config.to_dict(),
            model=identity,
            dtype=blocks.layout.kv_dtype,
            codec=codec,
            block_size=blocks.block_size,
            layout=f"hf-v{LAYOUT_VERSION}/{blocks.layout.describe()}",
            tenant=tenant,
        )
        digest = self.namespace.digest
        self.kv = StreamSpec(digest, LayerGroup.ATTENTION, codec)
        self.state_groups = blocks.state_groups()
        self.state = StreamSpec(digest, self.state_groups[0] if self.state_groups else LayerGroup.SSM, codec)

    def kv_keys(self, tokens: TokenArray, blocks: int) -> list[bytes]:
        """The chained key of each of the first ``blocks`` KV blocks of ``tokens``."""
        return block_keys(tokens[: blocks * self.block_size], self.block_size, namespace=self.namespace)

    def state_keys(self, tokens: TokenArray, blocks: int) -> dict[LayerGroup, list[bytes]]:
        """Per state group, the chained key of each block boundary up to ``blocks`` (distinct chains)."""
        ids = tokens[: blocks * self.block_size]
        return {
            g: block_keys(ids, self.block_size, extra=_GROUP_TAGS[g], namespace=self.namespace)
            for g in self.state_groups
        }


__all__ = ["LAYOUT_VERSION", "Streams", "weights_fingerprint"]
