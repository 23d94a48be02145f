"""What a hook tells the pipeline about a stream of blobs, and the one per-stream codec rule.

A *stream* is one kind of blob of one model: attention KV blocks, or recurrent / conv state. Its
:class:`StreamSpec` fixes the namespace, the layer group, and from those the role that stores it
(:func:`tierkv.roles.role_for`) and the codec it is stored in (:func:`codec_for`). An :class:`Expect`
is the header a blob must carry to be restored: anything else is corrupt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tierkv.codec import LayerGroup
from tierkv.codec.expect import Expect
from tierkv.roles import Role, role_for

STATE_CODEC = "raw"
"""Codec of every state stream, whatever the hook's KV codec."""


def codec_for(layer_group: LayerGroup, kv_codec: str) -> str:
    """The codec a stream of ``layer_group`` is stored in: ``kv_codec`` for KV, raw for states.

    States are always stored raw: they are small next to the KV, and an error in a recurrent state does
    not stay local to one block but carries into every later token.
    """
    return kv_codec if role_for(layer_group) is Role.KV_COLD else STATE_CODEC


@dataclass(frozen=True)
class StreamSpec:
    """One stream of blobs: its namespace digest, its layer group and the hook's KV codec."""

    namespace: bytes
    layer_group: LayerGroup
    kv_codec: str = "raw"

    @property
    def role(self) -> Role:
        """The cold role that stores this stream."""
        return role_for(self.layer_group)

    @property
    def codec(self) -> str:
        """The codec this stream's blobs are written in (see :func:`codec_for`)."""
        return codec_for(self.layer_group, self.kv_codec)

    def expect(self, shape: Sequence[int] | None, tokens: int | None, dtype: str | None = None) -> Expect:
        """The header a blob of this stream with ``shape`` and ``tokens`` must carry (None: any)."""
        return Expect(self.layer_group, self.codec, None if shape is None else tuple(shape), tokens, dtype)

    def sibling(self, layer_group: LayerGroup) -> StreamSpec:
        """The stream of ``layer_group`` in the same namespace (e.g. a model's CONV beside its SSM state)."""
        return StreamSpec(self.namespace, layer_group, self.kv_codec)


__all__ = ["STATE_CODEC", "Expect", "StreamSpec", "codec_for"]
