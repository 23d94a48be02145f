"""Sans-IO blob codecs: every stored KV/SSM block is a self-describing, checksummed blob.

::

    from tierkv.codec import encode, decode, read_header, BlobHeader, LayerGroup, CODECS
    blob = encode(array, codec="int8", tokens=16, layer_group=LayerGroup.ATTENTION)
    header, array = decode(blob, expect=Expect(shape=shape))

A blob is a header (:mod:`tierkv.codec.header` documents it byte by byte) followed by a payload: ``raw``
(the values, lossless, in their own dtype; :mod:`tierkv.codec.blob`) or ``int8`` (per-group absmax
with an exact side table for non-finite groups; :mod:`tierkv.codec.int8`). Decoding needs nothing but
the blob and verifies both checksums first. This package does no I/O and never imports torch; the torch
twin that quantizes on the tensor's own device is :mod:`tierkv.codec.torch_codec`.
"""

from __future__ import annotations

from tierkv.codec.blob import DTypeArg, decode, encode, verify
from tierkv.codec.expect import Expect
from tierkv.codec.header import (
    CODECS,
    DTYPES,
    FLAG_EXCEPTIONS,
    FORMAT_VERSION,
    MAGIC,
    MAX_HEADER_LEN,
    MIN_HEADER_LEN,
    BlobHeader,
    Buffer,
    Codec,
    DTypeInfo,
    LayerGroup,
    read_header,
)
from tierkv.codec.quality import max_abs_error, snr_db

__all__ = [
    "CODECS",
    "DTYPES",
    "FLAG_EXCEPTIONS",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_HEADER_LEN",
    "MIN_HEADER_LEN",
    "BlobHeader",
    "Buffer",
    "Codec",
    "DTypeArg",
    "DTypeInfo",
    "Expect",
    "LayerGroup",
    "decode",
    "encode",
    "max_abs_error",
    "read_header",
    "snr_db",
    "verify",
]
