"""Shared records and their protobuf messages have the same fields, and cross the wire unchanged."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tierkv.records import ClassStats, LeaseCounts, Successor, TenantStats
from tierkv.wire import pb
from tierkv.wire.records import from_message, to_message

PAIRS: list[tuple[Any, Any]] = [
    (ClassStats, pb.ClassStats),
    (TenantStats, pb.TenantStats),
    (LeaseCounts, pb.LeaseStats),
    (Successor, pb.Successor),
]


@pytest.mark.parametrize(("record", "message"), PAIRS, ids=lambda t: t.__name__)
def test_a_record_and_its_message_have_the_same_fields(record: Any, message: Any) -> None:
    assert [f.name for f in dataclasses.fields(record)] == [f.name for f in message.DESCRIPTOR.fields]


@pytest.mark.parametrize(("record", "message"), PAIRS, ids=lambda t: t.__name__)
def test_a_record_crosses_the_wire_unchanged(record: Any, message: Any) -> None:
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(record), start=1):
        kind = message.DESCRIPTOR.fields_by_name[f.name].type
        values[f.name] = {9: f"s{i}", 12: b"k%d" % i, 1: i + 0.5, 2: i + 0.5}.get(kind, i)
    original = record(**values)
    wire = to_message(original, message).SerializeToString()
    assert from_message(message.FromString(wire), record) == original
