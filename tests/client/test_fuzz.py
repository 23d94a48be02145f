"""Bounded fuzz runs of the client's reply parsing: whatever a peer answers, the client raises VaultError.

Seeded, and bounded both in inputs and in seconds so a loaded machine only shortens the run. The inputs
are random bytes and valid replies with bytes flipped, cut or inserted (the usual way to reach the deep
branches of a parser that random bytes alone rarely pass).
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
from collections.abc import Callable

import pytest

from tierkv.client._rpc import BlobSink, GetAssembler, parse_reply
from tierkv.client.bulk import RecvPool, _Wire, read_reply
from tierkv.errors import VaultError
from tierkv.wire import Blob, bulk, encode_frames, pb
from tierkv.wire.framing import Buffer

SEED = 20240610


def valid_frames(rng: random.Random) -> list[bytes]:
    n = rng.randint(0, 4)
    blobs = [
        Blob(key=rng.randbytes(rng.randint(1, 8)), data=rng.randbytes(rng.randint(0, 300)), index=i)
        for i in range(n)
    ]
    status = [Blob(key=b"gone", data=None, index=n, status=pb.MISSING)]
    return list(encode_frames(blobs + status, frame_bytes=rng.choice([16, 100, 4096]), namespace=b"ns"))


def damage(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(3)
        pos = rng.randint(0, len(buf))
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        elif op == 1:
            del buf[pos:]
        else:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 6))
    return bytes(buf)


def fuzzed_frames(rng: random.Random) -> list[bytes]:
    if rng.random() < 0.3:
        return [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(1, 3))]
    frames = valid_frames(rng) or [b""]
    i = rng.randrange(len(frames))
    frames[i] = damage(rng, frames[i])
    return frames


def run_bounded(count: int, seconds: float, one: Callable[[random.Random], None]) -> int:
    rng = random.Random(SEED)
    stop = time.monotonic() + seconds
    done = 0
    while done < count and time.monotonic() < stop:
        one(rng)
        done += 1
    return done


def test_fuzzed_batch_get_replies_raise_only_vault_error() -> None:
    outcomes = {"ok": 0, "VaultError": 0}

    def one(rng: random.Random) -> None:
        assembler = GetAssembler(rng.randint(0, 6), "fuzz:1")
        try:
            for frame in fuzzed_frames(rng):
                assembler.feed(frame)
            assembler.finish()
            outcomes["ok"] += 1
        except VaultError:
            outcomes["VaultError"] += 1

    done = run_bounded(20_000, 15.0, one)
    assert done >= 500, f"only {done} inputs in the time given"
    assert outcomes["VaultError"] > done / 10, outcomes


@pytest.mark.parametrize("message", [pb.StatsReply, pb.PutReply, pb.PrefixLookupReply, pb.FlushReply])
def test_fuzzed_control_replies_raise_only_vault_error(message: type[pb.StatsReply]) -> None:
    def one(rng: random.Random) -> None:
        raw = rng.randbytes(rng.randint(0, 30))
        with contextlib.suppress(VaultError):
            parse_reply(message, raw, "fuzz:1")

    assert run_bounded(5_000, 5.0, one) >= 100


def fuzzed_records(rng: random.Random) -> bytes:
    """A bulk reply stream: valid records around one damaged frame, or random bytes."""
    if rng.random() < 0.2:
        return rng.randbytes(rng.randint(0, 24))
    parts = []
    for frame in fuzzed_frames(rng):
        kind = rng.choice([bulk.FRAME] * 6 + [bulk.ERROR, bulk.END, 7])
        parts.append(bulk.record(kind, len(frame)) + frame)
    if rng.random() < 0.7:
        parts.append(bulk.record(bulk.END, 0))
    stream = b"".join(parts)
    return damage(rng, stream) if rng.random() < 0.5 else stream


class LandingSink:
    """Receives every key it is offered straight into memory of its own, like a restore into a cache."""

    def __init__(self, handed: list[tuple[int, bytes]]) -> None:
        self.handed = handed

    def __call__(self, i: int, blob: Buffer) -> None:
        self.handed.append((i, bytes(blob)))

    def land(self, i: int, size: int) -> Landed:
        return Landed(self.handed, i, size)


class Landed:
    def __init__(self, handed: list[tuple[int, bytes]], i: int, size: int) -> None:
        self.handed, self.i, self.memory = handed, i, bytearray(size)
        self.buffers = [memoryview(self.memory)]

    def landed(self) -> None:
        self.handed.append((self.i, bytes(self.memory)))

    def abandon(self) -> None:
        pass


@pytest.mark.parametrize("mode", ["kept", "streamed", "landed"])
def test_fuzzed_bulk_replies_raise_only_vault_error(mode: str) -> None:
    """The bulk reply reader over a real socket pair, fed what a broken or hostile port might send; also
    as ``get_each`` reads it (blobs handed over as they arrive, frames received into reused buffers), and
    as a restore reads it (blobs received straight into the sink's memory)."""
    errors: dict[str, int] = {}
    pool = RecvPool(max_bytes=1 << 16) if mode != "kept" else None

    def one(rng: random.Random) -> None:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            stream = fuzzed_records(rng)
            theirs.sendall(stream)
            theirs.shutdown(socket.SHUT_WR)
            n = rng.randint(0, 6)
            handed: list[tuple[int, bytes]] = []
            sink: BlobSink | None = None
            if mode == "streamed":
                sink = lambda i, blob: handed.append((i, bytes(blob)))
            elif mode == "landed":
                sink = LandingSink(handed)
            assembler = GetAssembler(n, "fuzz:1", sink)
            try:
                read_reply(_Wire(ours, time.monotonic() + 5, "fuzz:1", pool), assembler)
                assembler.finish()
            except VaultError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            assert all(0 <= i < n for i, _ in handed)
            assert [assembler.sizes[i] for i, _ in handed] == [len(b) for _, b in handed]

    done = run_bounded(3_000, 15.0, one)
    assert done >= 200, f"only {done} inputs in the time given"
    assert {"BulkRefused", "VaultError", "VaultUnavailable"} <= set(errors), errors


def test_a_reply_naming_a_key_twice_is_refused_before_the_second_copy_is_handed_over() -> None:
    twice = [Blob(key=b"k", data=b"first", index=0), Blob(key=b"k", data=b"second", index=0)]
    handed: list[bytes] = []
    assembler = GetAssembler(1, "fuzz:1", lambda i, blob: handed.append(bytes(blob)))
    with pytest.raises(VaultError, match="twice"):
        for frame in encode_frames(twice, frame_bytes=4096, namespace=b"ns"):
            assembler.feed(frame)
    assert handed == [b"first"]
