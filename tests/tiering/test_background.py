from __future__ import annotations

import functools
import threading

from tierkv.tiering.background import BoundedWorker


def test_jobs_run_in_order_and_failures_are_counted() -> None:
    worker = BoundedWorker(max_inflight=2)
    seen: list[int] = []

    def fail() -> None:
        raise RuntimeError("vault said no")

    for i in range(5):
        assert worker.submit(functools.partial(seen.append, i))
    assert worker.submit(fail)
    assert worker.drain(timeout=10)
    assert seen == [0, 1, 2, 3, 4]
    assert (worker.submitted, worker.completed, worker.failed) == (6, 5, 1)
    assert worker.close(timeout=10)
    assert not worker.submit(lambda: None)


def test_submit_blocks_at_the_inflight_bound() -> None:
    worker = BoundedWorker(max_inflight=1)
    gate = threading.Event()

    def blocked() -> None:
        gate.wait()

    worker.submit(blocked)
    submitted_second = threading.Event()

    def second() -> None:
        worker.submit(lambda: None)
        submitted_second.set()

    t = threading.Thread(target=second)
    t.start()
    assert not submitted_second.wait(0.2)  # back-pressure: the slot is taken
    assert worker.inflight == 1
    gate.set()
    assert submitted_second.wait(10)
    t.join(10)
    assert worker.close(timeout=10)
    assert worker.completed == 2
