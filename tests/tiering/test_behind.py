"""DecodeBehind: every blob handed over is decoded once, in runs on one worker, never more than ``window``
held at once, and a decoder's error reaches the caller."""

from __future__ import annotations

import random
import threading

import pytest

from tierkv.tiering.behind import DecodeBehind


def test_every_blob_is_decoded_once_in_index_order_per_run_and_copied_on_arrival() -> None:
    seen: list[tuple[int, bytes]] = []
    runs: list[list[int]] = []
    threads: set[str] = set()

    def run(blobs: object) -> None:
        assert isinstance(blobs, list)
        threads.add(threading.current_thread().name)
        runs.append([i for i, _ in blobs])
        seen.extend(blobs)

    frame = bytearray(b"abcdefgh" * 4)
    with DecodeBehind(run, window=64) as behind:
        for i in reversed(range(32)):  # arrival order is not key order
            behind.arrived(i, memoryview(frame)[i : i + 1])
        frame[:] = bytes(len(frame))  # the frame is reused: what was handed over must have been copied
    assert sorted(i for i, _ in seen) == list(range(32))
    assert dict(seen) == {i: b"abcdefgh"[i % 8 : i % 8 + 1] for i in range(32)}
    assert all(r == sorted(r) for r in runs)
    assert threads <= {"tierkv-decode-behind", "MainThread"}
    assert behind.runs == len(runs) and behind.busy_s >= 0


def test_a_receiver_that_outruns_the_decoder_never_holds_more_than_the_window() -> None:
    window, total = 4, 200
    lock = threading.Lock()
    handed = decoded = 0
    most = 0
    rng = random.Random(3)

    def run(blobs: object) -> None:
        nonlocal decoded
        assert isinstance(blobs, list)
        for _ in range(rng.randrange(1000, 20000)):  # a slow decoder, of varying speed
            pass
        with lock:
            decoded += len(blobs)

    with DecodeBehind(run, window=window) as behind:
        for i in range(total):
            behind.arrived(i, b"x")
            with lock:
                handed += 1
                most = max(most, handed - decoded)
    assert decoded == total
    assert most <= window


def test_a_receiver_that_finds_the_window_full_decodes_what_waits_itself() -> None:
    gate = threading.Event()
    runs: list[tuple[str, list[int]]] = []

    def run(blobs: object) -> None:
        assert isinstance(blobs, list)
        runs.append((threading.current_thread().name, [i for i, _ in blobs]))

    with DecodeBehind(run, window=3, init=lambda: gate.wait(10)) as behind:  # the worker is held up
        for i in range(4):
            behind.arrived(i, b"x")
        assert runs == [("MainThread", [0, 1, 2])], "the full window was decoded by the receiving thread"
        gate.set()
    assert sorted(i for _, r in runs for i in r) == [0, 1, 2, 3]


def test_the_decoders_error_is_raised_when_the_restore_closes_and_stops_the_worker() -> None:
    calls = 0

    def run(blobs: object) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("broken decoder")

    behind = DecodeBehind(run, window=2)
    behind.arrived(0, b"a")
    for i in range(1, 10):  # the worker stopped: arrivals are dropped, never block
        behind.arrived(i, b"b")
    with pytest.raises(RuntimeError, match="broken decoder"):
        behind.close()
    assert 1 <= calls <= 2  # the worker, and perhaps a receiver that found the window full


def test_leaving_on_an_error_stops_the_worker_without_decoding_the_rest() -> None:
    gate = threading.Event()
    decoded: list[int] = []

    def run(blobs: object) -> None:
        assert isinstance(blobs, list)
        gate.wait(10)
        decoded.extend(i for i, _ in blobs)

    with pytest.raises(KeyError), DecodeBehind(run, window=8) as behind:
        behind.arrived(0, b"a")
        behind.arrived(1, b"b")
        gate.set()
        raise KeyError("interrupted")
    assert not behind._thread.is_alive()
    assert set(decoded) <= {0, 1}


def test_a_window_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        DecodeBehind(lambda blobs: None, window=0)
