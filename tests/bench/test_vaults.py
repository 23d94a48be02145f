"""Which vaults a bench writes into: its own by default, others only when named (real vault processes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.bench.test_synthetic import bench
from tests.conftest import VaultFactory
from tierkv.bench import BenchError
from tierkv.bench.vaults import VAULT_MODES, parse_vaults
from tierkv.client.types import VaultStats
from tierkv.client.vault import VaultClient
from tierkv.endpoints import HostPort

SMALL = ("--tokens", "256", "--repeats", "1", "--batch-mib", "1")


def counters(address: str) -> VaultStats:
    with VaultClient(address) as client:
        return client.stats()


def fill(address: str, nbytes: int) -> None:
    """Real entries, as a production vault holds: 256 KiB blobs up to ``nbytes``."""
    blob = os.urandom(256 << 10)
    with VaultClient(address) as client:
        client.put(b"production", {f"entry-{i}".encode(): blob for i in range(nbytes // len(blob))})


def test_a_default_run_leaves_the_configured_vault_alone(vault_factory: VaultFactory, tmp_path: Path) -> None:
    # a nearly full production vault: a bench writing 2 × 3 MiB into it would evict its entries
    prod = vault_factory(name="prod", max_bytes="8MiB")
    fill(prod.address, 6 << 20)
    before = counters(prod.address)
    assert before.keys == 24 and before.evictions == 0
    toml = tmp_path / "prod.toml"
    toml.write_text(f'[cluster.kv_cold]\nhost = "127.0.0.1"\nport = {prod.port}\n')
    work = tmp_path / "cwd"
    work.mkdir()
    for spelling in (["synthetic"], []):  # the subcommand, and the deprecated bare-flags spelling
        out = work / "b.json"
        result = bench(*spelling, *SMALL, "--json", str(out), cwd=work, env={"TIERKV_CONFIG": str(toml)})
        assert result.returncode == 0, result.stdout + result.stderr
        doc = json.loads(out.read_text())
        assert doc["vaults"]["source"] == "local" and doc["vaults"]["delta"]["hits"] > 0
        assert [prod.address] not in doc["vaults"]["addresses"].values()
    after = counters(prod.address)
    assert (after.keys, after.used_bytes, after.evictions) == (before.keys, before.used_bytes, 0)
    assert (after.hits, after.misses, after.bytes_in) == (before.hits, before.misses, before.bytes_in)


def test_named_vaults_are_used_and_cleaned_up(vault_factory: VaultFactory, tmp_path: Path) -> None:
    kv = vault_factory(name="kv", max_bytes="64MiB")
    out = tmp_path / "b.json"
    result = bench(
        "synthetic", "--vaults", f"kv_cold={kv.address}", *SMALL, "--codec", "raw", "--json", str(out),
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert doc["vaults"]["source"] == "given" and doc["vaults"]["addresses"] == {"kv_cold": [kv.address]}
    assert any("writes into them" in w for w in doc["warnings"])
    stats = counters(kv.address)
    assert stats.hits == 256 // 16 + 2 and stats.keys == 0  # the restore (and warm-up) hit it; all deleted


def test_an_unreachable_ssm_vault_is_left_out(vault_factory: VaultFactory, tmp_path: Path) -> None:
    kv = vault_factory(name="kv", max_bytes="64MiB")
    out = tmp_path / "b.json"
    result = bench(
        "synthetic", "--vaults", f"kv_cold={kv.address},ssm_cold=127.0.0.1:9", *SMALL, "--codec", "raw",
        "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert doc["vaults"]["addresses"] == {"kv_cold": [kv.address]}
    assert any("ssm_cold vaults are unreachable" in w for w in doc["warnings"])


def test_unreachable_named_vaults_are_an_error_not_a_fallback(tmp_path: Path) -> None:
    result = bench("synthetic", "--vaults", "kv_cold=127.0.0.1:9", *SMALL, cwd=tmp_path)
    assert result.returncode == 2
    assert "unreachable" in result.stderr and "kv_cold 127.0.0.1:9" in result.stderr
    both = bench("synthetic", "--vaults", "kv_cold=127.0.0.1:9", "--use-config-vaults", *SMALL, cwd=tmp_path)
    assert both.returncode == 2 and "pick one" in both.stderr


ports = st.integers(min_value=1, max_value=65535)
hosts = st.sampled_from(["127.0.0.1", "localhost", "vault-3.example", "::1", "fe80::2"])
endpoints = st.builds(HostPort, hosts, ports)


@given(st.lists(endpoints, min_size=1, max_size=3), st.lists(endpoints, max_size=2))
def test_vault_addresses_round_trip(kv: list[HostPort], ssm: list[HostPort]) -> None:
    text = ",".join([f"kv_cold={e}" for e in kv] + [f" ssm_cold={e} " for e in ssm])
    mode, found = parse_vaults(text)
    assert mode == "given"
    assert found["kv_cold"] == tuple(e.address for e in kv)
    assert found.get("ssm_cold", ()) == tuple(e.address for e in ssm)


@given(st.text(max_size=40))
def test_any_other_text_is_a_bench_error(text: str) -> None:
    try:
        mode, found = parse_vaults(text)
    except BenchError as exc:
        assert str(exc).startswith("--vaults")
    else:
        assert mode in VAULT_MODES or "kv_cold" in found


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("inference=127.0.0.1:1", "not 'inference'"),
        ("kv_cold=::1:5000", "brackets"),
        ("kv_cold=127.0.0.1", "host:port"),
        ("kv_cold=127.0.0.1:70000", "port"),
        ("ssm_cold=127.0.0.1:5000", "kv_cold=HOST:PORT"),
        ("remote", "local, config, auto or ROLE=HOST:PORT"),
        ("hot=127.0.0.1:1", "unknown role"),
    ],
)
def test_bad_vault_addresses_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(BenchError, match="--vaults") as err:
        parse_vaults(text)
    assert says in str(err.value)
