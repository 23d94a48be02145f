"""What bounds a vault's memory: Put bytes in flight over gRPC count against a budget (a stalled or endless
sender is refused at it, and one tenant cannot fill it for the others), on real vault processes; the heap
trimmer's policy (trim once idle or under pressure, never on a timer inside a stream of calls) with an
injected clock and the real ``malloc_trim`` counted."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.conftest import VaultFactory
from tests.vault.rawcalls import Ident, metadata
from tierkv import VaultClient
from tierkv._malloc import trim_heap
from tierkv.vault.launcher import VaultProcess
from tierkv.vault.memory import InflightBudget, MemoryTrimmer
from tierkv.vault.status import Abort
from tierkv.wire import SERVICE, Blob, encode_frames

MiB = 1 << 20


def stalled_put(channel: grpc.Channel, frames: int, release: threading.Event, token: str | None = None):  # type: ignore[no-untyped-def]
    """A gRPC Put that sends ``frames`` frames of 1 MiB and then waits for ``release`` without ending."""
    blobs = [Blob(key=b"s%d" % i, data=os.urandom(MiB)) for i in range(frames)]
    sent = list(encode_frames(blobs, frame_bytes=MiB, namespace=b"stall"))

    def body() -> Iterator[bytes]:
        yield from sent
        release.wait(60)

    call = channel.stream_unary(f"/{SERVICE}/Put", Ident, Ident)
    return call.future(body(), timeout=60, metadata=metadata(token))


def budget_vault(vault_factory: VaultFactory, tmp_path: Path, tokens: str = "") -> VaultProcess:
    cfg = tmp_path / "vault.toml"
    text = '[vault]\ngrpc_max_inflight_bytes = "8MiB"\n'
    if tokens:
        (tmp_path / "tokens").write_text(tokens)
        text += f'[auth]\ntoken_file = "{tmp_path / "tokens"}"\n'
    cfg.write_text(text)
    return vault_factory(extra_args=["--config", str(cfg)])


def test_a_stalled_grpc_put_is_refused_at_the_in_flight_budget(
    vault_factory: VaultFactory, tmp_path: Path
) -> None:
    v = budget_vault(vault_factory, tmp_path)
    release = threading.Event()
    with grpc.insecure_channel(v.address) as ch:
        stalled = stalled_put(ch, 24, release)
        try:
            with pytest.raises(grpc.RpcError) as err:
                stalled.result(timeout=30)  # the vault ends it without waiting for the rest
            assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "in flight" in (err.value.details() or "")
        finally:
            release.set()
    with VaultClient(v.address, bulk=False) as c:  # the budget was given back
        assert c.put(b"ns", {b"k": os.urandom(4 * MiB)}) == 1
        assert c.get(b"ns", [b"stall0", b"s0"]) == [None, None]


TOKENS = """\
tok-admin ops   admin
tok-a     alpha user
tok-b     beta  user
"""


def test_one_tenants_stalled_puts_leave_room_for_another(vault_factory: VaultFactory, tmp_path: Path) -> None:
    """With several tenants one holds at most 3/4 of the budget (6 of 8 MiB): alpha's stalled streams
    are refused past it while beta's Put of 2 MiB fits beside them."""
    v = budget_vault(vault_factory, tmp_path, TOKENS)
    release = threading.Event()
    with grpc.insecure_channel(v.address) as ch:
        ended = threading.Event()
        calls = [stalled_put(ch, 4, release, token="tok-a") for _ in range(2)]
        for call in calls:
            call.add_done_callback(lambda _: ended.set())
        try:
            assert ended.wait(30), "the vault let alpha hold more than its share"
            err = next(c.exception() for c in calls if c.done())
            assert isinstance(err, grpc.RpcError) and err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "alpha" in (err.details() or "")
            with VaultClient(v.address, bulk=False, token="tok-b") as beta:
                assert beta.put(b"ns", {b"k": os.urandom(2 * MiB)}) == 1
        finally:
            release.set()


def test_the_in_flight_budget_is_exact_per_tenant_and_overall() -> None:
    budget = InflightBudget(8 * MiB, what="test", tenants=2)
    budget.take(6 * MiB, "a")
    with pytest.raises(Abort, match="'a' holds its share"):
        budget.take(1, "a")
    budget.take(2 * MiB, "b")
    with pytest.raises(Abort, match="in flight on test"):
        budget.take(1, "b")
    budget.give(6 * MiB, "a")
    budget.give(2 * MiB, "b")
    assert budget.held == 0 and budget.tenant_limit == 6 * MiB
    assert InflightBudget(8 * MiB, what="t").tenant_limit == 8 * MiB  # one tenant: all of it


def test_the_budget_tells_of_large_calls_and_bursts_as_they_end() -> None:
    """A trim may be due when a call of 16 MiB or more gives its bytes back (a refused one too), or when a
    burst of smaller calls that peaked there ends."""
    heard: list[int] = []
    budget = InflightBudget(256 * MiB, what="test", on_large=lambda: heard.append(budget.held))
    budget.take(20 * MiB, "t")
    budget.take(MiB, "t")
    budget.give(20 * MiB, "t")
    assert heard == [MiB]  # a large call ended while a small one is still in flight
    for _ in range(20):
        budget.take(MiB, "t")
    for _ in range(19):
        budget.give(MiB, "t")
    assert heard == [MiB]
    budget.give(2 * MiB, "t")  # idle again after a 21 MiB peak
    assert heard == [MiB, 0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def counting_trimmer(clock: Clock, anon: list[int]) -> tuple[MemoryTrimmer, list[float]]:
    """A trimmer that really trims (``malloc_trim``) and notes when."""
    trims: list[float] = []

    def trim() -> bool:
        trims.append(clock.now)
        trim_heap()
        return True

    return MemoryTrimmer(clock=clock, trim=trim, anon_bytes=lambda: anon[0]), trims


def test_a_stream_of_large_calls_is_never_trimmed_until_it_goes_idle() -> None:
    """Large calls 0.4 s apart for a minute: no trim (the former timer trimmed 2 s after the first and then
    every couple of seconds); once idle for ``idle_s``, one trim."""
    clock = Clock()
    trimmer, trims = counting_trimmer(clock, [0])
    for _ in range(150):
        trimmer.large_call_ended()
        clock.now += 0.4
        assert not trimmer.tick()
    assert trims == []
    assert trimmer.due_in(clock.now) == pytest.approx(trimmer.idle_s - 0.4)
    clock.now += trimmer.idle_s
    assert trimmer.tick() and len(trims) == 1
    assert trimmer.due_in(clock.now) == trimmer.idle_s  # one follow-up for what the burst's end frees
    clock.now += trimmer.idle_s
    assert trimmer.tick() and len(trims) == 2
    clock.now += 100
    assert not trimmer.tick() and trimmer.due_in(clock.now) is None  # and then nothing until the next


def test_memory_pressure_trims_at_once_but_not_more_than_once_per_interval() -> None:
    clock = Clock()
    anon = [10 * MiB]
    trimmer, trims = counting_trimmer(clock, anon)
    trimmer.large_call_ended()
    assert trims == []  # under the pressure mark: wait for idle
    anon[0] = trimmer.pressure_bytes + 1
    trimmer.large_call_ended()
    assert trims == [clock.now]
    clock.now += trimmer.pressure_interval_s / 2
    trimmer.large_call_ended()
    assert len(trims) == 1  # rate-limited
    clock.now += trimmer.pressure_interval_s
    trimmer.large_call_ended()
    assert len(trims) == 2


def test_the_trim_thread_stops() -> None:
    trimmer = MemoryTrimmer()
    trimmer.start()
    trimmer.stop()
    assert trimmer._thread is not None and not trimmer._thread.is_alive()
