"""The blob header: its fields, and that no tampering, truncation or mismatch ever decodes."""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest

from tierkv.codec import (
    MIN_HEADER_LEN,
    BlobHeader,
    LayerGroup,
    decode,
    encode,
    read_header,
    verify,
)
from tierkv.codec.expect import Expect
from tierkv.codec.header import checksum
from tierkv.errors import CodecError, CorruptBlobError

FIXED = struct.Struct("<4sHHBBBBHHIIQQQ")
# byte ranges of the fixed header fields, by name (the layout documented in tierkv.codec.header)
FIELDS = {
    "magic": (0, 4),
    "version": (4, 6),
    "header_len": (6, 8),
    "codec": (8, 9),
    "dtype": (9, 10),
    "ndim": (10, 11),
    "layer_group": (11, 12),
    "flags": (12, 14),
    "reserved": (14, 16),
    "group_size": (16, 20),
    "tokens": (20, 24),
    "value_count": (24, 32),
    "payload_len": (32, 40),
    "payload_checksum": (40, 48),
}


def sample(codec: str = "int8", nonfinite: bool = False) -> bytes:
    x = np.random.default_rng(0).standard_normal((2, 3, 40)).astype(np.float16)
    if nonfinite:
        x[1, 2, 5] = np.inf
    return encode(x, codec, group_size=16, tokens=12, layer_group=LayerGroup.SSM)


def reseal(blob: bytes, **changes: int | bytes) -> bytes:
    """Rewrite fixed header fields and recompute the header checksum (a well-formed but different header)."""
    fields = list(FIXED.unpack_from(blob))
    names = list(FIELDS)
    for name, value in changes.items():
        fields[names.index(name)] = value
    header_len = read_header(blob).header_len
    body = FIXED.pack(*fields) + blob[FIXED.size : header_len - 8]
    return body + struct.pack("<Q", checksum(body)) + blob[header_len:]


def test_header_fields_describe_the_blob() -> None:
    blob = sample()
    h = read_header(blob)
    assert h == BlobHeader(
        codec="int8",
        dtype="float16",
        shape=(2, 3, 40),
        group_size=16,
        value_count=240,
        tokens=12,
        layer_group=LayerGroup.SSM,
        flags=0,
        payload_len=15 * 4 + 240,
        payload_checksum=h.payload_checksum,
    )
    assert h.header_len == MIN_HEADER_LEN + 3 * 8 == 80 and h.blob_len == len(blob)
    assert h.decoded_nbytes == 480 and not h.has_exceptions
    assert blob[:4] == b"TKVB"
    assert h.pack() == blob[: h.header_len]


@pytest.mark.parametrize("codec", ["raw", "int8"])
def test_every_header_byte_is_protected(codec: str) -> None:
    blob = sample(codec, nonfinite=codec == "int8")
    header_len = read_header(blob).header_len
    for i in range(header_len):
        for bit in (0, 7):
            bad = bytearray(blob)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptBlobError):
                read_header(bad)
            with pytest.raises(CorruptBlobError):
                decode(bad)


@pytest.mark.parametrize("codec", ["raw", "int8"])
def test_every_payload_byte_is_protected(codec: str) -> None:
    blob = sample(codec, nonfinite=codec == "int8")
    header_len = read_header(blob).header_len
    rng = np.random.default_rng(1)
    positions = [*range(header_len, len(blob), 7), len(blob) - 1]
    for i in positions:
        bad = bytearray(blob)
        bad[i] ^= 1 << int(rng.integers(8))
        read_header(bad)  # the header alone is still fine
        with pytest.raises(CorruptBlobError, match="payload checksum"):
            decode(bad)
        with pytest.raises(CorruptBlobError):
            verify(bad)


@pytest.mark.parametrize("codec", ["raw", "int8"])
def test_truncated_or_padded_blobs_are_corrupt(codec: str) -> None:
    blob = sample(codec)
    for n in [0, 1, 4, MIN_HEADER_LEN - 1, MIN_HEADER_LEN, 79, 80, 81, len(blob) // 2, len(blob) - 1]:
        with pytest.raises(CorruptBlobError):
            decode(blob[:n])
    with pytest.raises(CorruptBlobError):
        decode(blob + b"\x00")
    assert read_header(blob[:80], partial=True) == read_header(blob)
    with pytest.raises(CorruptBlobError):
        read_header(blob[:79], partial=True)


@pytest.mark.parametrize(
    "changes",
    [
        {"version": 2},
        {"codec": 9},
        {"dtype": 9},
        {"layer_group": 0},
        {"flags": 0x8000},
        {"reserved": 1},
    ],
)
def test_a_well_formed_header_from_a_newer_writer_is_refused(changes: dict[str, int]) -> None:
    bad = reseal(sample(), **changes)
    with pytest.raises(CodecError):
        read_header(bad)


@pytest.mark.parametrize(
    "changes",
    [
        {"value_count": 241},
        {"payload_len": 299},
        {"group_size": 0},
        {"group_size": 15},
        {"flags": 1},  # claims an exception table that is not there
        {"codec": 1},  # raw header over an int8 payload
        {"magic": b"TKVC"},
    ],
)
def test_an_inconsistent_header_is_corrupt_even_with_a_valid_checksum(
    changes: dict[str, int | bytes],
) -> None:
    with pytest.raises(CorruptBlobError):
        decode(reseal(sample(), **changes))


def test_exception_table_is_validated() -> None:
    blob = sample(nonfinite=True)
    h = read_header(blob)
    base = h.header_len + 15 * 4 + 240
    count_at = base
    for patch in (struct.pack("<I", 0), struct.pack("<I", 2), struct.pack("<I", 999)):
        bad = bytearray(blob)
        bad[count_at : count_at + 4] = patch
        payload = bytes(bad[h.header_len :])
        body = bytearray(bad[: h.header_len - 8])
        body[40:48] = struct.pack("<Q", checksum(payload))  # re-seal the payload checksum too
        resealed = bytes(body) + struct.pack("<Q", checksum(bytes(body))) + payload
        with pytest.raises(CorruptBlobError, match="exception table"):
            decode(resealed)


def test_expectations_that_disagree_are_codec_errors_not_guesses() -> None:
    blob = sample()
    decode(blob, expect=Expect(LayerGroup.SSM, "int8", (2, 3, 40), 12, "float16"))
    mismatches = [
        Expect(shape=(6, 40)),
        Expect(shape=(2, 3, 41)),
        Expect(dtype="bfloat16"),
        Expect(dtype=np.float32),  # type: ignore[arg-type]
        Expect(codec="raw"),
        Expect(tokens=16),
        Expect(layer_group=LayerGroup.ATTENTION),
    ]
    for wrong in mismatches:
        with pytest.raises(CodecError) as info:
            decode(blob, expect=wrong)
        assert not isinstance(info.value, CorruptBlobError)


def test_decoding_garbage_never_raises_anything_but_codec_errors() -> None:
    rng = np.random.default_rng(5)
    blob = sample(nonfinite=True)
    for _ in range(300):
        bad = bytearray(blob)
        for i in rng.integers(0, len(bad), size=int(rng.integers(1, 4))):
            bad[int(i)] = int(rng.integers(256))
        if bytes(bad) == blob:
            continue
        with pytest.raises(CorruptBlobError):
            decode(bytes(bad))
    for n in range(0, 200, 13):
        with pytest.raises(CodecError):
            decode(rng.bytes(n))
    with pytest.raises(CodecError):
        decode("not bytes")  # type: ignore[arg-type]


def test_codec_package_does_not_import_torch() -> None:
    code = "import sys, tierkv.codec, tierkv.keys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_verify_parts_checks_a_raw_blob_received_in_pieces() -> None:
    from tierkv.codec import encode
    from tierkv.codec.blob import verify_parts

    values = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    blob = encode(values, codec="raw", tokens=3)
    head = 56 + 8 * 3
    rows = [blob[head : head + 48], blob[head + 48 :]]
    ok = {"expect": Expect(shape=(2, 3, 4), dtype="float32", tokens=3)}
    assert verify_parts(blob[:head], rows, **ok).payload_len == 96
    flipped = bytearray(rows[1])
    flipped[0] ^= 1
    with pytest.raises(CorruptBlobError, match="payload checksum"):
        verify_parts(blob[:head], [rows[0], bytes(flipped)], **ok)
    with pytest.raises(CorruptBlobError, match="add up"):
        verify_parts(blob[:head], rows[:1], **ok)
    with pytest.raises(CorruptBlobError, match="head"):
        verify_parts(blob[: head + 8], [rows[0][8:], rows[1]], **ok)
    with pytest.raises(CodecError, match="dtype"):
        verify_parts(blob[:head], rows, expect=ok["expect"].but(dtype="float16"))
    with pytest.raises(CodecError, match="shape"):
        verify_parts(blob[:head], rows, expect=ok["expect"].but(shape=(3, 2, 4)))
    int8 = encode(values, codec="int8", tokens=3)
    with pytest.raises(CodecError, match="codec"):
        verify_parts(int8[:head], [int8[head:]], **ok)
