"""A network partition between the engine and a vault, made for the test: the vault in a network namespace
of its own behind a veth pair, the client in another, and the vault's end of the link taken down while the
client holds its connections (packets vanish: no reset, no refusal, as when a switch or a cable goes).

Needs root and iproute2 (``ip``, ``tc``); skipped with the reason otherwise. The namespaces are the link
emulator's (:mod:`tierkv.bench.link.netns`), removed at the end whatever happened. The client runs in a
process of its own inside the engine's namespace: gRPC's threads, started earlier in this process, could
not reach the vault's address from here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tierkv.bench.link.netns import link_emulator
from tierkv.bench.link.spec import LinkSpec
from tierkv.vault.launcher import VaultProcess

ROOT = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ROOT, reason="a partition needs root and iproute2 (ip, tc) for its namespaces"),
]

TIMEOUT = 1.0
CLIENT = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    from tierkv.client.cluster import Cluster

    address, vault_ns, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    keys = [b"k%d" % i for i in range(16)]
    clock = [0.0]
    out = {}

    def link(state):
        subprocess.run(["ip", "-n", vault_ns, "link", "set", "tkv0", state], check=True, timeout=10)

    def timed(name, call):
        t0 = time.monotonic()
        out[name] = [call(), time.monotonic() - t0]

    with Cluster({"kv_cold": [address]}, timeout=timeout, clock=lambda: clock[0]) as c:
        out["stored"] = c.put(b"ns", {k: os.urandom(4096) for k in keys}).stored
        link("down")
        timed("lookup", lambda: c.prefix_lookup(b"ns", keys))
        timed("get", lambda: sum(b is not None for b in c.get(b"ns", keys)))
        timed("put", lambda: c.put(b"ns", {b"x%d" % i: os.urandom(1 << 20) for i in range(8)}).stored)
        timed("skipped", lambda: c.prefix_lookup(b"ns", keys))
        link("up")
        t0 = time.monotonic()
        while c.prefix_lookup(b"ns", keys) != len(keys) and time.monotonic() - t0 < 20:
            clock[0] += 60.0  # the breaker's backoff
            time.sleep(0.05)
        out["back_s"] = time.monotonic() - t0
        out["got"] = sum(b is not None for b in c.get(b"ns", keys))
    print(json.dumps(out))
    """
)


def test_a_partitioned_vault_costs_each_call_one_timeout_and_serves_again_once_healed(tmp_path: Path) -> None:
    """Lookup, restore and a Put of 8 MiB across a link that drops everything: each a miss within its
    deadline (the Put's grows by its bytes at 100 MB/s: 0.08 s here), then the open breaker answers at
    once; once the link is back, the same client reads every block."""
    with link_emulator(LinkSpec(rate_bps=10**9)) as link:
        vault = VaultProcess(
            tmp_path / "v",
            host=link.vault_host,
            prefix=link.vault_prefix,
            max_bytes="64MiB",
            allow_open=True,  # the link's namespace: nothing else reaches it
        ).start()
        try:
            done = subprocess.run(
                [
                    *link.engine_prefix,
                    sys.executable,
                    "-c",
                    CLIENT,
                    vault.address,
                    link.vault_ns,
                    str(TIMEOUT),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
        finally:
            vault.stop()
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["stored"] == 16
    for name in ("lookup", "get", "put"):
        result, elapsed = out[name]
        assert result == 0, f"{name} across a partition: {result}"
        assert elapsed < 1.5 * TIMEOUT + 0.1, f"{name} took {elapsed:.2f} s with a {TIMEOUT} s timeout"
    assert out["skipped"][0] == 0 and out["skipped"][1] < 0.1, "the breaker is open: no call goes out"
    assert out["back_s"] < 20 and out["got"] == 16
