"""The lease table on its own, on a clock the test moves: caps, ends, and the lookup/eviction race."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.vault.leases import MAX_LEASE_MS, LeaseTable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def table(max_bytes: int = 1000, **kwargs: int) -> tuple[LeaseTable, Clock]:
    clock = Clock()
    return LeaseTable(max_bytes, clock=clock, **kwargs), clock


def test_a_lease_holds_until_its_deadline_and_eviction_counts_it_honoured() -> None:
    leases, clock = table()
    assert leases.grant("t", [(b"a", 10), (b"b", 10)], 500, since=leases.mark()) == 2
    assert not leases.claim("t", b"a") and leases.leased("t", b"b")
    assert not leases.leased("u", b"a")  # another tenant's key of the same bytes is not leased
    clock.now += 0.499
    assert leases.leased("t", b"a")
    clock.now += 0.002
    assert leases.claim("t", b"a") and leases.sweep() == 1
    c = leases.counts()
    assert (c.granted, c.honoured, c.expired, c.held, c.leased_bytes) == (2, 1, 2, 0, 0)


def test_a_read_or_a_flush_ends_leases_and_frees_their_bytes() -> None:
    leases, _ = table()
    leases.grant("t", [(b"a", 10), (b"b", 20)], 1000, since=leases.mark())
    leases.grant("u", [(b"a", 30)], 1000, since=leases.mark())
    leases.release("t", [b"a"])
    assert leases.counts(["t"]).leased_bytes == 20 and leases.claim("t", b"a")
    leases.clear(["u"])
    assert leases.counts().leased_bytes == 20 and leases.held("u") == 0


def test_huge_leases_are_cut_to_the_cap_and_zero_grants_nothing() -> None:
    leases, clock = table()
    leases.grant("t", [(b"a", 1)], 2**32 - 1, since=leases.mark())
    leases.grant("t", [(b"z", 1)], 0, since=leases.mark())
    assert not leases.leased("t", b"z") and leases.counts().refused == 1
    clock.now += MAX_LEASE_MS / 1000 - 0.001
    assert leases.leased("t", b"a")
    clock.now += 0.002
    assert not leases.leased("t", b"a")


def test_leased_bytes_stop_at_the_tenant_cap_and_the_vault_cap() -> None:
    leases, _ = table(max_bytes=1000)  # caps: 250 of the budget, 25 of a 100-byte quota
    # past the cap the lookup reports only what it leased: a caller claims only leased blocks
    assert leases.grant("q", [(b"a", 20), (b"b", 20), (b"c", 1)], 1000, since=0, quota=100) == 1
    assert leases.counts(["q"]).leased_bytes == 20 and leases.counts(["q"]).refused == 2
    assert leases.grant("t", [(bytes([i]), 100) for i in range(5)], 1000, since=0) == 2
    assert leases.counts().leased_bytes == 220 and leases.counts(["t"]).granted == 2
    assert leases.grant("t", [(b"x", 100)], 0, since=0) == 1, "no lease asked: the count is unaffected"


def test_a_lookup_stops_before_an_entry_evicted_while_it_read() -> None:
    leases, _ = table()
    since = leases.mark()
    assert leases.claim("t", b"b")  # evicted after the lookup began
    assert leases.grant("t", [(b"a", 1), (b"b", 1), (b"c", 1)], 1000, since=since) == 1
    assert leases.grant("t", [(b"b", 1)], 1000, since=leases.mark()) == 1  # a later lookup: fine


def test_a_lookup_during_a_write_counts_that_writes_evictions_as_later() -> None:
    leases, _ = table()
    leases.mark()  # an earlier lookup asked for a lease: evictions are remembered from here on
    with leases.writing():
        leases.claim("t", b"x")  # the write transaction evicts before the lookup starts...
        since = leases.mark()
        # ...but has not committed, so the lookup's snapshot may still show the entry
        assert leases.grant("t", [(b"x", 1)], 1000, since=since) == 0


def test_the_first_lookup_during_a_write_that_already_evicted_grants_and_reports_nothing() -> None:
    leases, _ = table()
    with leases.writing():
        assert leases.claim("t", b"x")  # no lookup ever asked for a lease: not remembered
        since = leases.mark()
        assert leases.grant("t", [(b"x", 1)], 1000, since=since) == 0
        assert not leases.leased("t", b"x")  # blind: the write's earlier evictions are unknown
    assert leases.grant("t", [(b"x", 1)], 1000, since=leases.mark()) == 1 and leases.leased("t", b"x")


def test_a_lookup_that_outlived_the_eviction_history_grants_and_reports_nothing() -> None:
    leases, _ = table(history=4)
    since = leases.mark()
    for i in range(6):
        leases.claim("t", bytes([i]))
    assert leases.grant("t", [(b"k", 1)], 1000, since=since) == 0
    assert not leases.leased("t", b"k")


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("grant"),
            st.sampled_from(["a", "b"]),
            st.lists(st.tuples(st.binary(max_size=2), st.integers(0, 300)), max_size=6),
            st.integers(0, 2 * MAX_LEASE_MS),
            st.integers(0, 800),
        ),
        st.tuples(st.just("claim"), st.sampled_from(["a", "b"]), st.binary(max_size=2)),
        st.tuples(st.just("release"), st.sampled_from(["a", "b"]), st.binary(max_size=2)),
        st.tuples(st.just("clock"), st.floats(0, 12)),
        st.tuples(
            st.just("sweep"),
        ),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_the_table_stays_within_its_bounds(steps: list[tuple[object, ...]]) -> None:
    leases, clock = table(max_bytes=1000, max_leases=5, history=8)
    for step in steps:
        match step:
            case ("grant", str(tenant), list(entries), int(ms), int(quota)):
                n = leases.grant(tenant, entries, ms, since=leases.mark(), quota=quota)
                if ms:  # every entry reported is leased: a caller never claims an unleased block
                    assert n <= len(entries) and all(leases.leased(tenant, k) for k, _ in entries[:n])
                else:
                    assert n == len(entries)
            case ("claim", str(tenant), bytes(fkey)):
                if leases.claim(tenant, fkey):
                    assert not leases.leased(tenant, fkey)
                else:
                    assert leases.leased(tenant, fkey)
            case ("release", str(tenant), bytes(fkey)):
                leases.release(tenant, [fkey])
            case ("clock", float(dt)):
                clock.now += dt
            case _:
                leases.sweep()
        live = leases._leases
        assert len(live) <= 5
        assert all(deadline <= clock.now + MAX_LEASE_MS / 1000 for deadline, _ in live.values())
        for tenant in ("a", "b"):
            held = [charge for (t, _), (_, charge) in live.items() if t == tenant]
            counts = leases.counts([tenant])
            assert counts.held == len(held) == leases.held(tenant)
            assert counts.leased_bytes == sum(held) <= 0.25 * 1000
        assert leases.counts().leased_bytes <= 250
        assert len(leases._evicted) <= 8


def test_each_tenant_holds_at_most_its_share_so_none_starves_another() -> None:
    """Two tenants share the bounds: one filling its share of bytes (or of the lease count) leaves the
    other's share untouched (before: first come, first served, and the other tenant got nothing)."""
    leases, _ = table(max_bytes=1000, tenants=2)  # 250 leased bytes in all, 125 each
    hog = [(b"h%d" % i, 25) for i in range(10)]
    assert leases.grant("hog", hog, 1000, since=leases.mark()) == 5
    assert leases.grant("fair", [(b"a", 60), (b"b", 60)], 1000, since=leases.mark()) == 2
    few, _ = table(max_bytes=10**9, max_leases=8, tenants=2)
    assert few.grant("hog", [(b"h%d" % i, 1) for i in range(8)], 1000, since=few.mark()) == 4
    assert few.grant("fair", [(b"a", 1), (b"b", 1), (b"c", 1), (b"d", 1)], 1000, since=few.mark()) == 4
