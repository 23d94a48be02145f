"""A tierkv 0.1 launch line (its inline ``kv_connector_extra_config`` keys) starts a real vLLM engine that
stores and restores, with int8 blobs for 0.1's ``turbo_quant``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.connectors.vllm.engine import (
    BLOCK_SIZE,
    generate_counted,
    make_llm,
    module_vault,
    prompt,
    scheduler_connector,
    shutdown,
    store_then_forget,
    write_tiny_llama,
)
from tierkv.client.vault import VaultClient
from tierkv.codec.header import read_header
from tierkv.vault.launcher import VaultProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPT = prompt(31, 300)  # 9 full blocks


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VaultProcess]:
    yield from module_vault(tmp_path_factory.mktemp("vault-legacy"))


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_0_1_launch_line_starts_vllm_and_restores(tmp_path: Path, vault: VaultProcess) -> None:
    host, port = vault.address.rsplit(":", 1)
    extra = {
        "kv_cold_host": host,
        "kv_cold_port": int(port),
        "turbo_quant": True,
        "kv_dim": 64,
        "block_size": BLOCK_SIZE,
        "max_inflight_promotes": 4,
    }
    seen = Lines()
    logging.getLogger("tierkv").addHandler(seen)
    try:
        llm = make_llm(write_tiny_llama(tmp_path / "m"), extra)
    finally:
        logging.getLogger("tierkv").removeHandler(seen)
    try:
        conn = scheduler_connector(llm)
        assert conn.settings.kv_cold == (vault.address,)
        assert conn.settings.codec == "int8"
        for key in ("kv_cold_host", "turbo_quant", "kv_dim", "block_size", "max_inflight_promotes"):
            assert any(key in line and "0.1" in line for line in seen.lines), (key, seen.lines)

        _, stored = store_then_forget(llm, PROMPT)
        assert stored["stored_blocks"] == 9 and stored.get("restore_tokens", 0) == 0
        _, restored = generate_counted(llm, PROMPT)
        assert restored["restored_blocks"] == 9
        assert restored["restore_tokens"] == 9 * BLOCK_SIZE, "the plain count of tokens taken from the vaults"
        assert restored.get("load_errors", 0) == 0

        namespace = conn.identity.stream_namespace(conn.topology.streams[0])
        with VaultClient(vault.address) as client:
            listing, _ = client.list_namespaces()
        (ours,) = [ns for ns in listing if ns.namespace == namespace]
        assert read_header(ours.head, partial=True).codec == "int8"
    finally:
        shutdown(llm)
