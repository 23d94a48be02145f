"""The per-vault circuit breaker, model-based: calls start (if let through) and end in success or failure in
any interleaving, several in flight at once, while an injected clock moves; after every step the breaker's
answers and its reported state are checked against an independent model of the promises:

- closed, every call goes out; ``threshold`` failures in a row open it for the current backoff;
- open, no call goes out until the backoff has passed; then it is half-open: exactly one probe goes out
  at a time;
- a success closes it and resets the backoff; a failed probe re-opens it with the backoff doubled, up to
  its cap; a failure of a call let through while closed counts toward the threshold;
- a failure of a call that started before the breaker last opened changes nothing: it says nothing of
  the vault now (it neither fails the probe nor pushes the reopening further).

The model keeps the time it reopens at and derives "half-open" from the clock, rather than a state field.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tierkv.client.breaker import BreakerState, CircuitBreaker

THRESHOLD, BASE, CAP = 3, 1.0, 8.0


class BreakerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.breaker = CircuitBreaker(
            threshold=THRESHOLD, backoff_s=BASE, max_backoff_s=CAP, clock=lambda: self.now
        )
        self.failures = 0
        self.backoff = BASE
        self.reopens_at: float | None = None  # None: closed
        self.probe_out = False
        self.openings = 0
        self.in_flight: list[tuple[bool, int, int]] = []  # per call let through: probe?, openings, ticket

    def _half_open(self) -> bool:
        return self.reopens_at is not None and self.now >= self.reopens_at

    @rule()
    def start_call(self) -> None:
        if self.reopens_at is None:
            expect, probe = True, False
        else:
            expect = self._half_open() and not self.probe_out
            probe = expect
        ticket = self.breaker.allow()
        assert (ticket is not None) == expect
        if ticket is not None:
            self.probe_out = self.probe_out or probe
            self.in_flight.append((probe, self.openings, ticket))

    @rule(i=st.integers(0, 7), ok=st.booleans())
    def end_call(self, i: int, ok: bool) -> None:
        if not self.in_flight:
            return
        probe, openings, ticket = self.in_flight.pop(i % len(self.in_flight))
        if ok:
            self.breaker.success()
            self.failures, self.backoff, self.reopens_at, self.probe_out = 0, BASE, None, False
            self.in_flight = [(False, n, t) for _, n, t in self.in_flight]  # no probe is out once closed
            return
        self.breaker.failure(ticket)
        if openings != self.openings:
            return  # started before the last opening
        self.failures += 1
        if probe and self.probe_out:
            self.backoff = min(self.backoff * 2, CAP)
            self.reopens_at, self.probe_out = self.now + self.backoff, False
            self.openings += 1
        elif self.failures >= THRESHOLD and self.reopens_at is None:
            self.reopens_at = self.now + self.backoff
            self.openings += 1

    @rule(dt=st.sampled_from([0.25, 1.0, 3.0, 10.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def state_is_the_models(self) -> None:
        if self.reopens_at is None:
            expect = BreakerState.CLOSED
        elif self._half_open():
            expect = BreakerState.HALF_OPEN
        else:
            expect = BreakerState.OPEN
        assert self.breaker.state == expect, (self.breaker.state, expect, self.now, self.reopens_at)


BreakerModel.TestCase.settings = settings(max_examples=1000, stateful_step_count=40, deadline=None)
TestBreakerModel = BreakerModel.TestCase
