"""Extra-config parsing, namespaces, block keys and counters of the vLLM connector, without vLLM."""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tierkv.connectors import vault_settings
from tierkv.connectors.vllm import settings as settings_module
from tierkv.connectors.vllm.identity import TIERKV, Identity, KeyBook, choose_hash_scheme, make_identity
from tierkv.connectors.vllm.plan import KV, GroupPlan, make_topology
from tierkv.connectors.vllm.settings import KNOWN_KEYS, ConnectorSettings, load_failure_policy
from tierkv.connectors.vllm.stats import PREFETCH_FIELDS, Counters, PrefetchFeed, merge
from tierkv.errors import ConfigError
from tierkv.keys import block_keys, wrap_engine_hashes

TOML = """
[cluster]
timeout = 0.5
kv_cold = [{host = "10.0.0.1", port = 6000}, {host = "10.0.0.2", port = 6001}]
ssm_cold = {host = "10.0.0.3", port = 6002}
"""


def test_inline_keys_work_without_a_toml_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIERKV_CONFIG", raising=False)
    s = ConnectorSettings.from_extra({"kv_cold": "127.0.0.1:50051, 127.0.0.1:50052", "codec": "int8"})
    assert s.kv_cold == ("127.0.0.1:50051", "127.0.0.1:50052")
    assert s.ssm_cold == ()
    assert s.codec == "int8"


def test_toml_file_then_inline_overrides(tmp_path: Path) -> None:
    path = tmp_path / "tierkv.toml"
    path.write_text(TOML)
    s = ConnectorSettings.from_extra({"config_path": str(path)})
    assert s.kv_cold == ("10.0.0.1:6000", "10.0.0.2:6001")
    assert s.ssm_cold == ("10.0.0.3:6002",)
    assert s.timeout == 0.5
    s = ConnectorSettings.from_extra({"config_path": str(path), "kv_cold": ["127.0.0.1:1"], "timeout": 3})
    assert s.kv_cold == ("127.0.0.1:1",)
    assert s.timeout == 3.0


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"kv_cold": "nohost"}, "kv_cold"),
        ({"kv_cold": "h:99999"}, "kv_cold"),
        ({"kv_cold": ""}, "kv_cold"),
        ({"codec": "zstd"}, "codec"),
        ({"hash": "md5"}, "hash"),
        ({"load_mode": "eager"}, "load_mode"),
        ({"timeout": "fast"}, "timeout"),
        ({"max_inflight_stores": 0}, "max_inflight_stores"),
        ({"max_queued_stores": 1.5}, "max_queued_stores"),
        ({"kv_cld": "127.0.0.1:1"}, "kv_cld"),
        ({"config_path": "/nonexistent/tierkv.toml"}, "--config"),
    ],
)
def test_bad_extra_config_names_the_key(extra: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        ConnectorSettings.from_extra({"kv_cold": "127.0.0.1:1", **extra})
    assert err.value.key == key


INHERITED = ("kv_cold", "ssm_cold", "timeout", "config")


def test_errors_have_the_shape_of_every_settings_source() -> None:
    with pytest.raises(ConfigError) as err:
        ConnectorSettings.from_extra({"kv_cold": "127.0.0.1:1", "codec": "zstd"})
    assert str(err.value) == "kv_connector_extra_config: codec: expected one of 'raw', 'int8', got 'zstd'"


def test_defaults_are_the_schema_and_ipv6_addresses_parse(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIERKV_CONFIG", raising=False)
    s = ConnectorSettings.from_extra({"kv_cold": ["[::1]:50051"]})
    assert s.kv_cold == ("[::1]:50051",)
    defaults = ConnectorSettings()
    for f in dataclasses.fields(ConnectorSettings):
        if f.name not in INHERITED:
            assert getattr(s, f.name) == getattr(defaults, f.name), f.name
    assert {f.name for f in dataclasses.fields(ConnectorSettings)} - {"config"} == KNOWN_KEYS


def test_the_settings_reach_the_vaults_through_the_storage_seam_only() -> None:
    """The connector's settings open their vaults through the plugin settings they extend."""

    def imported(module: ModuleType) -> set[str]:
        return {
            node.module
            for node in ast.walk(ast.parse(Path(str(module.__file__)).read_text()))
            if isinstance(node, ast.ImportFrom) and node.module is not None
        }

    for module in (settings_module, vault_settings):
        assert not any(m.startswith("tierkv.client") for m in imported(module)), imported(module)
    assert "tierkv.connectors.vault_settings" in imported(settings_module)
    assert "tierkv.tiering.storage" in imported(vault_settings)


def identity(**overrides: Any) -> Identity:
    args: dict[str, Any] = {
        "model": "/models/tiny",
        "dtype": "bfloat16",
        "codec": "raw",
        "block_size": 16,
        "kv_layout": "LBHNC",
        "tp_world": 2,
        "pp_world": 1,
    }
    args.update(overrides)
    return make_identity({"model_type": "llama", "num_hidden_layers": 2}, **args)


def test_namespaces_separate_streams_ranks_and_identity() -> None:
    topo = make_topology([GroupPlan(0, KV, 16, ("a",))], [], 16)
    (stream,) = topo.streams
    ident = identity()
    ranks = ident.all_ranks(stream)
    assert len(set(ranks)) == 2
    assert ranks[0] == identity().stream_namespace(stream, 0)
    for other in (
        identity(codec="int8"),
        identity(dtype="float16"),
        identity(tenant="b"),
        identity(kv_layout="x"),
    ):
        assert other.stream_namespace(stream) != ranks[0]


def test_hash_scheme_uses_engine_hashes_only_when_reproducible() -> None:
    assert choose_hash_scheme("auto", "sha256", None) == "engine:sha256:default"
    assert choose_hash_scheme("auto", "sha256_cbor", "7") == "engine:sha256_cbor:7"
    assert choose_hash_scheme("auto", "xxhash", None) == TIERKV
    assert choose_hash_scheme("auto", "xxhash", "0") == "engine:xxhash:0"
    assert choose_hash_scheme("tierkv", "sha256", None) == TIERKV


@dataclass
class TokenRequest:
    """The fields of a vLLM request that key computation reads."""

    request_id: str
    all_token_ids: list[int]
    block_hashes: list[bytes] = field(default_factory=list)
    cache_salt: str | None = None
    mm_features: list[object] | None = None


def test_tierkv_keys_chain_over_tokens_and_grow_with_the_request() -> None:
    topo = make_topology([GroupPlan(0, KV, 4, ("a",))], [], 4)
    book = KeyBook(identity(), topo, TIERKV)
    req = TokenRequest("r", list(range(10)))
    first = book.keys(req)
    assert len(first) == 2
    req.all_token_ids += [10, 11, 12]
    grown = book.keys(req)
    assert grown[:2] == first and len(grown) == 3
    assert grown == block_keys(list(range(13)), 4, extra=b"salt=;lora=", namespace=book.namespace)
    salted = KeyBook(identity(), topo, TIERKV).keys(TokenRequest("s", list(range(13)), cache_salt="x"))
    assert salted[0] != grown[0]
    assert book.keys(TokenRequest("m", list(range(13)), mm_features=[object()])) == []


def test_engine_keys_wrap_vllm_hashes_per_block() -> None:
    topo = make_topology([GroupPlan(0, KV, 8, ("a",))], [], 4)
    book = KeyBook(identity(), topo, "engine:sha256:default")
    hashes = [bytes([i]) * 32 for i in range(5)]
    req = TokenRequest("r", [], block_hashes=hashes[:3])
    assert book.keys(req) == wrap_engine_hashes(book.namespace, [hashes[1]])
    req.block_hashes = hashes
    keys = book.keys(req)
    assert keys == wrap_engine_hashes(book.namespace, [hashes[1], hashes[3]]), "the hash at each block's end"
    other = KeyBook(identity(), topo, "engine:sha256:7").keys(TokenRequest("r", [], block_hashes=hashes))
    assert set(keys).isdisjoint(other), "another NONE_HASH seed must not share keys"


def test_counters_give_intervals_and_totals() -> None:
    c = Counters()
    c.add("stored_blocks", 3)
    c.add("load_errors")
    assert c.take() == {"stored_blocks": 3, "load_errors": 1}
    assert c.take() == {}
    c.add("stored_blocks", 2)
    assert c.totals()["stored_blocks"] == 5
    with pytest.raises(KeyError):
        c.add("typo")
    assert merge({"a": 1}, {"a": 2, "b": 3}) == {"a": 3, "b": 3}


@pytest.mark.parametrize(
    ("load_failure", "configured", "runs"),
    [("recompute", "fail", "recompute"), ("recompute", "recompute", "recompute"), ("engine", "fail", "fail")],
)
def test_a_failed_load_is_recomputed_unless_the_engine_policy_is_kept(
    load_failure: str, configured: str, runs: str
) -> None:
    assert ConnectorSettings().load_failure == "recompute"
    assert load_failure_policy(load_failure, configured) == runs  # type: ignore[arg-type]


def test_prefetch_counters_reach_the_connector_counters_as_increments() -> None:
    counters = Counters()
    feed = PrefetchFeed(counters)
    stats = dataclasses.make_dataclass("S", [(f, int, 0) for f in PREFETCH_FIELDS])()
    stats.hits, stats.wasted_bytes = 3, 100
    feed.update(stats)
    stats.hits = 5
    feed.update(stats)
    assert counters.take() == {"prefetch_hits": 5, "prefetch_wasted_bytes": 100}
    feed.update(stats)
    assert counters.take() == {}
