"""tierkv 0.1's inline extra-config keys mapped to today's, and tierkv's log lines joining vLLM's log,
without vLLM."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tierkv.connectors.vllm.legacy import DROPPED, migrate_extra
from tierkv.connectors.vllm.settings import ConnectorSettings
from tierkv.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
OLD = {
    "kv_cold_host": "10.0.0.2",
    "kv_cold_port": 6000,
    "ssm_cold_host": "10.0.0.3",
    "ssm_cold_port": 6001,
    "kv_dim": 128,
    "turbo_quant": True,
    "block_size": 16,
    "max_inflight_promotes": 8,
}


def test_every_0_1_key_is_mapped_or_dropped_with_one_warning_each(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIERKV_CONFIG", raising=False)
    with caplog.at_level("WARNING", logger="tierkv"):
        s = ConnectorSettings.from_extra(OLD)
    assert s.kv_cold == ("10.0.0.2:6000",)
    assert s.ssm_cold == ("10.0.0.3:6001",)
    assert s.codec == "int8"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 + len(DROPPED), warnings
    for key, why in DROPPED.items():
        assert any(f"{key}: tierkv 0.1 key, ignored: {why}" in w for w in warnings)
    assert any('using "kv_cold": "10.0.0.2:6000"' in w for w in warnings)
    assert any('using "codec": "int8"' in w for w in warnings)


def test_0_1_defaults_and_address_forms() -> None:
    out = migrate_extra({"kv_cold_host": "::1", "turbo_quant": False, "namespace": "a"}, "x")
    assert out == {"kv_cold": "[::1]:50051", "codec": "raw", "namespace": "a"}
    assert migrate_extra({"kv_cold": "h:1"}, "x") == {"kv_cold": "h:1"}


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"kv_cold_host": "h", "kv_cold": "h:1"}, "kv_cold_host"),
        ({"kv_cold_port": 1}, "kv_cold_port"),
        ({"turbo_quant": "yes"}, "turbo_quant"),
        ({"turbo_quant": True, "codec": "raw"}, "turbo_quant"),
        ({"kv_cold_host": "h", "kv_cold_port": 99999}, "kv_cold"),
    ],
)
def test_mixed_or_bad_0_1_keys_name_the_key(extra: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        ConnectorSettings.from_extra(extra)
    assert info.value.key == key


JOIN = """
import logging, sys
theirs = logging.getLogger("vllm")
handler = logging.StreamHandler(sys.stdout)
handler.setFormatter(logging.Formatter("VLLM %(levelname)s [%(name)s] %(message)s"))
theirs.addHandler(handler)
theirs.setLevel(logging.INFO)
theirs.propagate = False
{setup}
from tierkv.connectors.vllm.logs import join_vllm_log
print("joined", join_vllm_log(), join_vllm_log())
logging.getLogger("tierkv.connectors.vllm.connector").info("tierkv connector: restores off (why)")
logging.getLogger("tierkv.connectors.vllm.connector").debug("not at INFO")
"""


def run_join(setup: str = "") -> str:
    code = textwrap.dedent(JOIN.format(setup=setup))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout + done.stderr


def test_tierkv_info_lines_go_through_vllms_handler_once() -> None:
    out = run_join()
    assert "joined True True" in out
    lines = [line for line in out.splitlines() if "restores off" in line]
    assert lines == ["VLLM INFO [tierkv.connectors.vllm.connector] tierkv connector: restores off (why)"]
    assert "not at INFO" not in out


def test_an_application_that_configured_logging_keeps_its_own_setup() -> None:
    out = run_join("logging.basicConfig(level=logging.INFO, format='APP %(message)s')")
    assert "joined False False" in out
    assert [line for line in out.splitlines() if "restores off" in line] == [
        "APP tierkv connector: restores off (why)"
    ]
