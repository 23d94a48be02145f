"""Lookup leases on real LMDB and real vault processes: a leased block outlives a flood of puts, the
budget still holds exactly, leased bytes stay capped, and a lease is nothing more than that (it ends,
it is per tenant, it never blocks deletes, flushes or outlives a restart)."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import VaultFactory
from tests.ports import free_port
from tests.vault import test_tenancy
from tierkv.client.vault import VaultClient
from tierkv.vault.launcher import VaultProcess
from tierkv.vault.leases import MAX_LEASE_MS, LeaseCounts
from tierkv.vault.store import Store

BUDGET = 100_000
CHAIN = [b"c%d" % i for i in range(5)]  # 5 entries of 4,904 bytes: 24,520, under the 25,000 lease cap


def blob(i: int, size: int = 4900) -> bytes:
    return bytes([i % 256]) * size


def chain_store(path: Path, n: int = 5) -> Store:
    s = Store(path, BUDGET, sync_mode="fast")
    s.put_many(b"ns", [(b"c%d" % i, blob(i), 0) for i in range(n)])
    return s


def flood(s: Store, rounds: int = 40, size: int = 4900, tag: bytes = b"f") -> None:
    """Put twice the budget of other entries, checking the budget after every put."""
    for i in range(rounds):
        outcome = s.put_many(b"flood", [(tag + b"%d" % i, blob(i, size), 0)])
        assert not outcome.rejected
        assert s.stats().used_bytes <= BUDGET


def present(s: Store, keys: list[bytes]) -> list[bool]:
    return [s.debug.index_record(b"ns", k) is not None for k in keys]


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def test_a_leased_chain_survives_a_flood_and_goes_after_the_lease_expires(tmp_path: Path) -> None:
    clock = FakeClock()
    with Store(tmp_path, BUDGET, sync_mode="fast", clock=clock, maintenance_interval_s=3600) as s:
        s.put_many(b"ns", [(k, blob(i), 0) for i, k in enumerate(CHAIN)])
        assert s.prefix_lookup(b"ns", CHAIN, lease_ms=300) == 5
        flood(s)
        assert present(s, CHAIN) == [True] * 5, "a lease holds however long the flood takes"
        assert s.stats().leases.honoured > 0
        clock.t += 0.301
        flood(s, tag=b"g")
        assert present(s, CHAIN) == [False] * 5
        counts = s.stats().leases
        assert (counts.granted, counts.expired, counts.held, counts.leased_bytes) == (5, 5, 0, 0)


def test_a_read_ends_the_lease(tmp_path: Path) -> None:
    with chain_store(tmp_path) as s:
        assert s.prefix_lookup(b"ns", CHAIN, lease_ms=MAX_LEASE_MS) == 5
        flood(s)
        assert s.get_many(b"ns", CHAIN) == [blob(i) for i in range(5)]
        assert s.stats().leases.held == 0
        flood(s, tag=b"g")
        assert present(s, CHAIN) == [False] * 5


def test_the_budget_holds_exactly_when_only_leased_entries_could_make_room(tmp_path: Path) -> None:
    with chain_store(tmp_path) as s:
        s.put_many(b"ns", [(b"other", blob(9, 20_000), 0)])
        assert s.prefix_lookup(b"ns", CHAIN, lease_ms=MAX_LEASE_MS) == 5
        # 75,000 bytes would fit if the chain went; only the unleased 20,008 bytes may go: refused
        outcome = s.put_many(b"ns", [(b"big", blob(1, 76_000), 0)])
        assert outcome.rejected == [0]
        assert s.stats().used_bytes <= BUDGET and present(s, CHAIN) == [True] * 5
        for round_ in range(3):  # leases on flood entries too, sizes that leave gaps
            for i in range(30):
                s.put_many(b"flood", [(b"%d-%d" % (round_, i), blob(i, 1000 + 997 * i), 0)])
                used = s.stats().used_bytes
                charged = sum(len(k) - 1 + len(v) for k, v in s.debug.blobs().items())
                assert used == charged <= BUDGET
                s.prefix_lookup(b"flood", [b"%d-%d" % (round_, i)], lease_ms=MAX_LEASE_MS)
        assert present(s, CHAIN) == [True] * 5
        assert s.stats().leases.leased_bytes <= BUDGET // 4


def test_leased_bytes_stop_at_the_cap_and_the_lookup_reports_only_what_it_leased(tmp_path: Path) -> None:
    chain = [b"c%d" % i for i in range(10)]
    with chain_store(tmp_path, n=10) as s:
        assert s.prefix_lookup(b"ns", chain, lease_ms=MAX_LEASE_MS) == 5, "only leased blocks are reported"
        counts = s.stats().leases
        assert (counts.granted, counts.refused, counts.leased_bytes) == (5, 5, 5 * 4904)
        assert s.prefix_lookup(b"ns", chain) == 10, "without a lease every present block is reported"
        flood(s)
        assert present(s, chain) == [True] * 5 + [False] * 5


def test_huge_lease_values_are_capped(tmp_path: Path) -> None:
    with chain_store(tmp_path) as s:
        s.prefix_lookup(b"ns", CHAIN, lease_ms=2**32 - 1)
        limit = time.monotonic() + MAX_LEASE_MS / 1000
        assert all(deadline <= limit for deadline in s.debug.lease_deadlines())


def test_no_lease_asked_changes_nothing(tmp_path: Path) -> None:
    with chain_store(tmp_path) as s:
        assert s.prefix_lookup(b"ns", CHAIN) == 5
        assert s.prefix_lookup(b"ns", CHAIN, lease_ms=0) == 5
        flood(s)
        assert present(s, CHAIN) == [False] * 5
        assert s.stats().leases == LeaseCounts()


def test_leases_never_block_deletes_or_flushes_nor_outlive_a_restart(tmp_path: Path) -> None:
    with chain_store(tmp_path) as s:
        s.prefix_lookup(b"ns", CHAIN, lease_ms=MAX_LEASE_MS)
        assert s.delete(b"ns", CHAIN[:2]) == 2
        assert s.stats().leases.held == 3
        assert s.flush(b"ns") == 3
        assert s.stats().leases.held == 0
        s.put_many(b"ns", [(k, blob(i), 0) for i, k in enumerate(CHAIN)])
        s.prefix_lookup(b"ns", CHAIN, lease_ms=MAX_LEASE_MS)
        assert s.flush() == 5 and s.stats().leases.held == 0
        s.put_many(b"ns", [(k, blob(i), 0) for i, k in enumerate(CHAIN)])
        s.prefix_lookup(b"ns", CHAIN, lease_ms=MAX_LEASE_MS)
    with Store(tmp_path, BUDGET, sync_mode="fast") as s:
        assert s.stats().leases.held == 0
        flood(s)
        assert present(s, CHAIN) == [False] * 5


# -- over the wire ------------------------------------------------------------------------------------


def test_a_leased_chain_survives_a_flood_through_a_real_vault(vault_factory: VaultFactory) -> None:
    port = free_port()
    vault = vault_factory(
        max_bytes="1MiB", sync="fast", extra_args=["--metrics-port", str(port), "--policy", "lru"]
    )  # under lru the flood pushes out the chain once the read ended its lease
    chain = {b"k%d" % i: blob(i, 16_000) for i in range(4)}
    with VaultClient(vault.address, timeout=30) as c:
        c.put(b"ns", chain)
        assert c.prefix_lookup(b"ns", list(chain), lease_ms=10_000) == 4
        for i in range(8):  # 2 MiB through a 1 MiB vault
            assert c.put(b"flood", {b"%d-%d" % (i, j): blob(j, 16_000) for j in range(16)}) == 16
        assert c.get(b"ns", list(chain)) == list(chain.values())  # the read ends the lease
        for i in range(8):
            c.put(b"flood", {b"x%d-%d" % (i, j): blob(j, 16_000) for j in range(16)})
        assert c.prefix_lookup(b"ns", list(chain)) == 0
        with pytest.raises(ValueError, match="lease_ms"):
            c.prefix_lookup(b"ns", list(chain), lease_ms=2**32)
        assert c.prefix_lookup(b"flood", [b"x7-15"], lease_ms=2**32 - 1) == 1
        leases = c.stats().leases  # the Stats reply carries what Prometheus shows
        assert (leases.granted, leases.held, leases.leased_bytes) == (5, 1, 16010) and leases.honoured > 0
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "tierkv_vault_leases_granted_total 5.0" in text
    assert "tierkv_vault_leased_bytes 16010.0" in text  # the last lookup's lease, still held
    honoured = next(
        line for line in text.splitlines() if line.startswith("tierkv_vault_leases_honoured_total")
    )
    assert float(honoured.split()[1]) > 0


tenant_vault = test_tenancy.tenant_vault  # the fixture: tenants alpha (tok-a) and beta (tok-b)


def test_a_lease_of_one_tenant_shows_another_nothing(tenant_vault: VaultProcess) -> None:
    vault = tenant_vault
    keys = [b"k0", b"k1"]
    with VaultClient(vault.address, token="tok-a") as a, VaultClient(vault.address, token="tok-b") as b:
        a.put(b"shared", {k: b"alpha" for k in keys})
        assert a.prefix_lookup(b"shared", keys, lease_ms=10_000) == 2
        assert b.prefix_lookup(b"shared", keys, lease_ms=10_000) == 0
        assert a.stats().leases.held == 2 and b.stats().leases.held == 0, "each tenant sees its own"
        assert b.get(b"shared", keys) == [None, None]
        assert a.get(b"shared", keys) == [b"alpha", b"alpha"]


def test_one_big_put_walks_past_leases_scattered_through_the_order(tmp_path: Path) -> None:
    with Store(tmp_path, BUDGET, sync_mode="fast") as s:
        keys = [b"s%02d" % i for i in range(40)]
        s.put_many(b"ns", [(k, blob(i, 2000), 0) for i, k in enumerate(keys)])
        leased = keys[::4]  # 10 entries of 2,005 bytes, every fourth in eviction order
        for k in leased:
            assert s.prefix_lookup(b"ns", [k], lease_ms=MAX_LEASE_MS) == 1
        outcome = s.put_many(b"flood", [(b"%d" % i, blob(i, 2000), 0) for i in range(45)])
        assert not outcome.rejected and s.stats().used_bytes <= BUDGET
        assert present(s, keys) == [k in leased for k in keys]


def test_what_a_leased_lookup_reports_is_readable_while_another_thread_floods(tmp_path: Path) -> None:
    """The lookup/eviction race: every block a lookup reports under a lease is still there to read, with
    puts evicting all the while (bounded in count and time)."""
    with Store(tmp_path, BUDGET, sync_mode="fast") as s:
        stop = threading.Event()
        flooded = [0]

        def flood_forever() -> None:
            while not stop.is_set() and flooded[0] < 20_000:
                s.put_many(b"flood", [(b"%d" % flooded[0], blob(flooded[0]), 0)])
                flooded[0] += 1

        def until_the_flood_turned_the_store_over(after: int) -> None:
            """Sleep until the flood has put twice what the store holds since ``after`` (so it has tried to
            evict everything, leased blocks included), as an engine takes a few milliseconds between lookup
            and load; at most 0.2 s, so a starved flood ends the wait, not the test."""
            end = time.monotonic() + 0.2
            while flooded[0] - after < 2 * BUDGET // len(blob(0)) and time.monotonic() < end:
                time.sleep(0.0005)

        flooder = threading.Thread(target=flood_forever)
        flooder.start()
        try:
            deadline, reported = time.monotonic() + 3, 0
            for round_ in range(300):
                if time.monotonic() > deadline:
                    break
                chain = [b"r%d-%d" % (round_, i) for i in range(4)]
                s.put_many(b"ns", [(k, blob(i), 0) for i, k in enumerate(chain)])
                n = s.prefix_lookup(b"ns", chain, lease_ms=MAX_LEASE_MS)
                until_the_flood_turned_the_store_over(flooded[0])
                assert None not in s.get_many(b"ns", chain[:n])
                reported += n
        finally:
            stop.set()
            flooder.join()
        assert reported and s.stats().leases.honoured


def test_one_tenants_leases_cannot_starve_another(tenant_vault: VaultProcess) -> None:
    """Beta leases a quarter of the 16 MiB vault and keeps renewing; alpha's leased lookups still report
    its blocks (before: beta took the whole vault-wide lease allowance and alpha's lookups reported 0)."""
    blob = b"b" * (64 * 1024)
    hog_keys = [b"h%d" % i for i in range(64)]
    mine = [b"a0", b"a1", b"a2"]
    with (
        VaultClient(tenant_vault.address, token="tok-b") as hog,
        VaultClient(tenant_vault.address, token="tok-a") as alpha,
    ):
        hog.put(b"ns", dict.fromkeys(hog_keys, blob))
        alpha.put(b"ns", dict.fromkeys(mine, blob))
        for _ in range(3):  # renewals change nothing
            held = hog.prefix_lookup(b"ns", hog_keys, lease_ms=10_000)
        assert 0 < held < len(hog_keys), "the hog is held to its share"
        assert alpha.prefix_lookup(b"ns", mine, lease_ms=10_000) == len(mine)
