"""The wire: protobuf messages generated from ``proto/`` and the hand-built framing of bulk payloads."""

from tierkv.wire._proto import vault_pb2 as pb
from tierkv.wire.framing import Blob, FrameDecoder, FrameError, encode_frames

SERVICE = "tierkv.v1.Vault"

__all__ = ["SERVICE", "Blob", "FrameDecoder", "FrameError", "encode_frames", "pb"]
