"""tierkv-bulk/1 parsing (sans-IO): anything a peer sends is a FrameError or a well-formed value."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.wire import FrameError, bulk

RECORD_PARSERS = {
    "reply": (bulk.parse_record, bulk._RECORD_LIMITS),
    "put request": (bulk.parse_request_record, bulk._REQUEST_RECORD_LIMITS),
}


@pytest.mark.parametrize("side", sorted(RECORD_PARSERS))
@settings(max_examples=1000, deadline=None)
@given(head=st.binary(max_size=12))
def test_any_record_head_parses_or_is_a_frame_error(side: str, head: bytes) -> None:
    """Reply records may be FRAME, END or ERROR; a Put request's only FRAME or END."""
    parse, limits = RECORD_PARSERS[side]
    try:
        kind, length = parse(head)
    except FrameError:
        return
    assert len(head) == bulk.RECORD.size
    assert kind in limits and length <= limits[kind]


@settings(max_examples=1000, deadline=None)
@given(head=st.binary(max_size=16))
def test_any_request_head_parses_or_is_a_frame_error(head: bytes) -> None:
    try:
        op, token_len = bulk.parse_request_head(head)
    except FrameError:
        return
    assert head[:4] == bulk.MAGIC and op in bulk.OPS and 0 <= token_len <= bulk.MAX_TOKEN_BYTES


@given(payload=st.binary(max_size=64))
def test_any_error_payload_names_a_status(payload: bytes) -> None:
    code, details = bulk.parse_error(payload)
    assert code.replace("_", "").isalpha() and code.isupper() and isinstance(details, str)


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (bulk.record(9, 0), "unknown kind"),
        (bulk.record(bulk.END, 1), "declares"),
        (bulk.record(bulk.FRAME, 0xFFFFFFFF), "declares"),
        (b"\x01\x00", "record head is"),
    ],
)
def test_record_heads_the_vault_never_sends_are_refused(head: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        bulk.parse_record(head)


def test_a_short_request_head_is_a_protocol_error_not_struct_error() -> None:
    with pytest.raises(bulk.BulkProtocolError):
        bulk.parse_request_head(b"TKVB")
    assert bulk.parse_request_head(bulk.encode_request("tok", b"")[: bulk.REQUEST_HEAD.size]) == (1, 3)
    assert bulk.parse_request_head(bulk.request_head(None, bulk.OP_PUT)) == (bulk.OP_PUT, 0)


def test_a_client_cannot_send_an_error_record_nor_an_unknown_operation() -> None:
    with pytest.raises(FrameError, match="unknown kind"):
        bulk.parse_request_record(bulk.record(bulk.ERROR, 4))
    unknown = max(bulk.OPS) + 1
    with pytest.raises(FrameError, match=f"operation {unknown}"):
        bulk.parse_request_head(bulk.REQUEST_HEAD.pack(bulk.MAGIC, bulk.VERSION, unknown, 0))


def test_an_error_record_round_trips() -> None:
    assert bulk.parse_error(bulk.error_payload("RESOURCE_EXHAUSTED", "busy now")) == (
        "RESOURCE_EXHAUSTED",
        "busy now",
    )
