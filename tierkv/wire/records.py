"""The one place shared records meet protobuf: a record and its message have the same fields, by name.

Vault and client speak of the same figures with the same dataclasses (:mod:`tierkv.records`, and the
vault's lease counts); on the wire each is a protobuf message with exactly those fields. These two
functions carry a record across, field by field, so a field added on one side and not the other fails
the tests (``tests/wire/test_records.py``) instead of silently travelling as a default.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from google.protobuf.message import Message

M = TypeVar("M", bound=Message)
R = TypeVar("R")


def to_message(record: Any, message_type: type[M]) -> M:
    """``record`` (a dataclass instance) as a ``message_type`` message."""
    return message_type(**{f.name: getattr(record, f.name) for f in dataclasses.fields(record)})


def from_message(message: Message, record_type: type[R]) -> R:
    """``message`` as a ``record_type`` dataclass (every field of the record read from the message)."""
    fields = dataclasses.fields(record_type)  # type: ignore[arg-type]
    return record_type(**{f.name: getattr(message, f.name) for f in fields})


__all__ = ["from_message", "to_message"]
