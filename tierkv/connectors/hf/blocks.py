"""The transformers hook's cache layout as blocks: what one blob of each stream holds.

- attention KV of block ``i``: all attention layers at once, ``[layers, 2, kv_heads, block, head_dim]``,
  layer group ``ATTENTION``, ``tokens = block_size``;
- recurrent (SSM / linear-attention) states at a block boundary: every layer's state flattened into one
  vector, layer group ``SSM``, ``tokens = boundary position``; conv states likewise as ``CONV``.

Which codec each stream is written in, and the verification of every blob, are the pipeline's
(:mod:`tierkv.tiering`); here is only how the model's tensors map to those arrays and back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from tierkv.codec import LayerGroup
from tierkv.codec.torch_codec import dtype_name
from tierkv.connectors.hf.layout import KV, CacheLayout, StateSnapshot, StateSpec
from tierkv.tiering import Expect, StreamSpec


class ModelBlocks:
    """One model's blocks and state snapshots as arrays (see the module docstring)."""

    def __init__(self, layout: CacheLayout, block_size: int) -> None:
        self.layout = layout
        self.block_size = block_size
        self._specs: dict[LayerGroup, Sequence[StateSpec]] = {
            g: s for g, s in ((LayerGroup.SSM, layout.recurrent), (LayerGroup.CONV, layout.conv)) if s
        }

    # -- KV --------------------------------------------------------------------------------------------

    def kv_block(self, kv: Sequence[KV], block: int) -> torch.Tensor:
        """Block ``block`` of per-layer KV tensors ``[1, heads, seq, dim]`` as one tensor."""
        s, e = block * self.block_size, (block + 1) * self.block_size
        # One stack of every layer's K and V slice: a single copy into the block tensor.
        parts = [x[0, :, s:e] for layer in kv for x in layer]
        return torch.stack(parts).view(len(kv), 2, *parts[0].shape)

    def kv_expect(self, spec: StreamSpec) -> Expect:
        """The header every KV blob of this model must carry."""
        shape = self.layout.block_shape(self.block_size)
        return spec.expect(shape, self.block_size, dtype_name(self.layout.kv_dtype))

    def kv_buffer(self, tokens: int, device: torch.device) -> torch.Tensor:
        """Room for ``tokens`` tokens of every layer's KV: ``[layers, 2, kv_heads, tokens, head_dim]``."""
        size = list(self.layout.block_shape(self.block_size))
        size[3] = tokens
        return torch.empty(size, dtype=self.layout.kv_dtype, device=device)

    # -- states ----------------------------------------------------------------------------------------

    def state_groups(self) -> list[LayerGroup]:
        """The state groups this layout stores, in key order."""
        return list(self._specs)

    def state_arrays(self, snapshot: StateSnapshot) -> dict[LayerGroup, torch.Tensor]:
        """Each state group of ``snapshot`` as one flat vector."""
        tensors = {LayerGroup.SSM: snapshot.recurrent, LayerGroup.CONV: snapshot.conv}
        return {g: torch.cat([t.reshape(-1) for t in tensors[g]]) for g in self._specs}

    def state_expects(self, spec: StreamSpec, position: int) -> list[Expect]:
        """The headers of the state blobs at ``position``, one per group in :meth:`state_groups` order."""
        return [
            spec.sibling(g).expect((sum(s.numel for s in specs),), position, dtype_name(specs[0].dtype))
            for g, specs in self._specs.items()
        ]

    def state_buffers(self, device: torch.device) -> list[torch.Tensor]:
        """Empty flat vectors to decode the state groups into, in :meth:`state_groups` order."""
        return [
            torch.empty(sum(s.numel for s in specs), dtype=specs[0].dtype, device=device)
            for specs in self._specs.values()
        ]

    def snapshot(self, flats: Sequence[torch.Tensor]) -> StateSnapshot:
        """The snapshot held by decoded flat vectors (from :meth:`state_buffers`)."""
        parts: Mapping[LayerGroup, tuple[torch.Tensor, ...]] = {
            g: _split(flat, specs) for (g, specs), flat in zip(self._specs.items(), flats, strict=True)
        }
        return StateSnapshot(conv=parts.get(LayerGroup.CONV, ()), recurrent=parts.get(LayerGroup.SSM, ()))


def _split(flat: torch.Tensor, specs: Sequence[StateSpec]) -> tuple[torch.Tensor, ...]:
    out = []
    offset = 0
    for s in specs:
        out.append(flat[offset : offset + s.numel].reshape(s.shape))
        offset += s.numel
    return tuple(out)


__all__ = ["ModelBlocks"]
