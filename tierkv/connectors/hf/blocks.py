"""Blobs of one model's cache: one per (block, layer group).

- attention KV of block ``i``: all attention layers at once, ``[layers, 2, kv_heads, block, head_dim]``,
  in the session's codec (raw or int8), layer group ``ATTENTION``, ``tokens = block_size``;
- recurrent (SSM / linear-attention) states at a block boundary: every layer's state flattened into
  one vector, layer group ``SSM``, ``tokens = boundary position``; conv states likewise as ``CONV``.
  States are always stored raw: they are small next to the KV, and an error in a recurrent state
  does not stay local to one block but carries into every later token.

Every decoded blob is checked against the layout (group, token count, shape, dtype) besides the
codec's own header and payload checksums; a mismatch is a miss, never a restore.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from tierkv.codec import Buffer, LayerGroup
from tierkv.codec.torch_codec import decode_tensor, encode_tensor
from tierkv.connectors.hf.layout import KV, CacheLayout, StateSnapshot, StateSpec
from tierkv.errors import CodecError

logger = logging.getLogger(__name__)

STATE_CODEC = "raw"


@dataclass
class DecodeResult:
    """A prefix and the leading valid blocks of a batch: ``[layers, 2, kv_heads, tokens, head_dim]``."""

    kv: torch.Tensor | None
    blocks: int
    rejected: int


class BlockCodec:
    """Encodes and decodes one model's blocks and state snapshots (see the module docstring)."""

    def __init__(self, layout: CacheLayout, block_size: int, codec: str) -> None:
        self.layout = layout
        self.block_size = block_size
        self.codec = codec

    def encode_kv_block(self, kv: Sequence[KV], block: int) -> bytes:
        """Blob of block ``block`` taken from per-layer KV tensors ``[1, heads, seq, dim]``."""
        s, e = block * self.block_size, (block + 1) * self.block_size
        # One stack of every layer's K and V slice: a single copy into the block tensor.
        parts = [x[0, :, s:e] for layer in kv for x in layer]
        t = torch.stack(parts).view(len(kv), 2, *parts[0].shape)
        return encode_tensor(t, codec=self.codec, tokens=self.block_size, layer_group=LayerGroup.ATTENTION)

    def decode_kv_blocks(
        self,
        blobs: Sequence[Buffer | None],
        device: torch.device,
        prefix: Sequence[KV] = (),
        prefix_tokens: int = 0,
    ) -> DecodeResult:
        """Decode the leading run of blobs that are present and verify; stop at the first that is not.

        The result holds the first ``prefix_tokens`` tokens of ``prefix`` (per-layer KV, e.g. a hot
        entry's) followed by the decoded blocks: each block is decoded straight into its token range
        of one preallocated tensor, so a restore that joins the tiers needs no concatenation.
        """
        expected = self.layout.block_shape(self.block_size)
        present = next((i for i, b in enumerate(blobs) if b is None), len(blobs))
        if present == 0:
            return DecodeResult(None, 0, 0)
        size = list(expected)
        size[3] = prefix_tokens + present * self.block_size
        kv = torch.empty(size, dtype=self.layout.kv_dtype, device=device)
        if prefix_tokens:
            for layer, (k, v) in zip(kv[:, :, :, :prefix_tokens], prefix, strict=True):
                layer[0].copy_(k[0, :, :prefix_tokens])
                layer[1].copy_(v[0, :, :prefix_tokens])
        decoded = rejected = 0
        for i, blob in enumerate(blobs[:present]):
            assert blob is not None
            start = prefix_tokens + i * self.block_size
            try:
                decode_tensor(
                    blob,
                    dtype=self.layout.kv_dtype,
                    out=kv[:, :, :, start : start + self.block_size],
                    expect_shape=expected,
                    expect_dtype=self.layout.kv_dtype,
                    expect_codec=self.codec,
                    expect_tokens=self.block_size,
                    expect_layer_group=LayerGroup.ATTENTION,
                )
            except CodecError as exc:
                logger.warning("KV block %d rejected: %s", i, exc)
                rejected = 1
                break
            decoded += 1
        if not decoded:
            return DecodeResult(None, 0, rejected)
        return DecodeResult(kv[:, :, :, : prefix_tokens + decoded * self.block_size], decoded, rejected)

    def encode_states(self, snapshot: StateSnapshot, position: int) -> dict[LayerGroup, bytes]:
        """The SSM and CONV blobs of a snapshot taken after ``position`` tokens."""
        out: dict[LayerGroup, bytes] = {}
        for group, tensors in ((LayerGroup.SSM, snapshot.recurrent), (LayerGroup.CONV, snapshot.conv)):
            if tensors:
                flat = torch.cat([t.reshape(-1) for t in tensors])
                out[group] = encode_tensor(flat, codec=STATE_CODEC, tokens=position, layer_group=group)
        return out

    def state_groups(self) -> list[LayerGroup]:
        """The state groups this layout stores, in key order."""
        groups = []
        if self.layout.recurrent:
            groups.append(LayerGroup.SSM)
        if self.layout.conv:
            groups.append(LayerGroup.CONV)
        return groups

    def decode_states(
        self, blobs: Mapping[LayerGroup, Buffer | None], position: int, device: torch.device
    ) -> StateSnapshot | None:
        """The snapshot at ``position`` if every group's blob is present and verifies, else None."""
        parts: dict[LayerGroup, tuple[torch.Tensor, ...]] = {LayerGroup.SSM: (), LayerGroup.CONV: ()}
        for group, specs in ((LayerGroup.SSM, self.layout.recurrent), (LayerGroup.CONV, self.layout.conv)):
            if not specs:
                continue
            blob = blobs.get(group)
            if blob is None:
                return None
            split = self._decode_group(blob, group, specs, position, device)
            if split is None:
                return None
            parts[group] = split
        return StateSnapshot(conv=parts[LayerGroup.CONV], recurrent=parts[LayerGroup.SSM])

    @staticmethod
    def _decode_group(
        blob: Buffer,
        group: LayerGroup,
        specs: Sequence[StateSpec],
        position: int,
        device: torch.device,
    ) -> tuple[torch.Tensor, ...] | None:
        try:
            _, flat = decode_tensor(
                blob,
                device=device,
                expect_shape=(sum(s.numel for s in specs),),
                expect_dtype=specs[0].dtype,
                expect_codec=STATE_CODEC,
                expect_tokens=position,
                expect_layer_group=group,
            )
        except CodecError as exc:
            logger.warning("%s state at %d rejected: %s", group.name, position, exc)
            return None
        out = []
        offset = 0
        for s in specs:
            out.append(flat[offset : offset + s.numel].reshape(s.shape))
            offset += s.numel
        return tuple(out)


__all__ = ["STATE_CODEC", "BlockCodec", "DecodeResult"]
