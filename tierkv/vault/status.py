"""Transport-neutral outcomes of a vault call.

The service raises :class:`Abort` with a :class:`Status`; each front end turns it into its own answer
(a gRPC status at the gRPC edge, an ERROR record on the bulk port), so only the gRPC edge imports grpc.
The names are gRPC's, so both transports report the same code for the same failure.
"""

from __future__ import annotations

import enum


class Status(enum.Enum):
    OK = "OK"
    CANCELLED = "CANCELLED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"


class Abort(Exception):
    """Ends a call with ``status``; ``details`` is what the caller is told (never a traceback)."""

    def __init__(self, status: Status, details: str) -> None:
        super().__init__(details)
        self.status = status
        self.details = details


def invalid(details: str) -> Abort:
    return Abort(Status.INVALID_ARGUMENT, details)


__all__ = ["Abort", "Status", "invalid"]
