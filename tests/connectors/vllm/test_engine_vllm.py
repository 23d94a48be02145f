"""TierKVConnector inside a real vLLM engine (CPU, tiny random Llama) against real vault processes.

Every check compares with a reference engine that has no connector at all (run once, in a subprocess),
and reads the connector's own counters to prove where the tokens came from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.connectors.vllm.engine import (
    BLOCK_SIZE,
    Output,
    generate_counted,
    make_llm,
    module_vault,
    probe_request,
    prompt,
    scheduler_connector,
    shutdown,
    store_then_forget,
    write_tiny_llama,
)
from tierkv.client.vault import VaultClient
from tierkv.codec.torch_codec import decode_tensor
from tierkv.errors import CorruptBlobError
from tierkv.vault.launcher import VaultProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
STORED = prompt(1, 300)  # 9 full blocks, 12 tokens left over
LONGER = STORED[:200] + prompt(2, 200)  # shares 6 full blocks with STORED
CORRUPTED = prompt(3, 300)
DOWN = prompt(4, 300)
PROMPTS = {"stored": STORED, "longer": LONGER, "corrupted": CORRUPTED, "down": DOWN}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def reference(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Output]:
    """Greedy outputs of an engine without a connector, computed in a separate process."""
    work = tmp_path_factory.mktemp("reference")
    names = list(PROMPTS)
    (work / "prompts.json").write_text(json.dumps([PROMPTS[n] for n in names]))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.connectors.vllm.engine",
            "--model",
            str(model_dir),
            "--prompts",
            str(work / "prompts.json"),
            "--out",
            str(work / "out.json"),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    outs = json.loads((work / "out.json").read_text())
    return {n: (tokens, logprobs) for n, (tokens, logprobs) in zip(names, outs, strict=True)}


@pytest.fixture(scope="module", params=["async", "sync"])
def load_mode(request: pytest.FixtureRequest) -> str:
    """Asynchronous loads (the default) and loads inside the step (``load_mode: sync``)."""
    return str(request.param)


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory, load_mode: str) -> Iterator[VaultProcess]:
    yield from module_vault(tmp_path_factory.mktemp(f"vault-{load_mode}"))


@pytest.fixture(scope="module")
def llm(model_dir: Path, vault: VaultProcess, load_mode: str) -> Iterator[Any]:
    engine = make_llm(model_dir, {"kv_cold": vault.address, "timeout": 1.0, "load_mode": load_mode})
    yield engine
    shutdown(engine)


def assert_same(got: Output, want: Output) -> None:
    assert got[0] == want[0]
    assert got[1] == pytest.approx(want[1], abs=1e-4)


def test_identical_prompt_is_restored_from_the_vault(llm: Any, reference: dict[str, Output]) -> None:
    first, stored = store_then_forget(llm, STORED)
    assert stored["stored_blocks"] == 9
    assert stored["store_requests"] == 1

    second, restored = generate_counted(llm, STORED)
    assert restored["lookup_hit_tokens"] == 9 * BLOCK_SIZE
    assert restored["restored_blocks"] == 9
    assert restored["load_landed_blocks"] == 9, "received straight into the CPU cache's block rows"
    assert restored.get("load_errors", 0) == 0
    assert_same(first, reference["stored"])
    assert_same(second, reference["stored"])


def test_longer_prompt_restores_only_the_shared_blocks(llm: Any, reference: dict[str, Output]) -> None:
    store_then_forget(llm, STORED)
    out, restored = generate_counted(llm, LONGER)
    assert restored["lookup_hit_tokens"] == 6 * BLOCK_SIZE
    assert restored["restored_blocks"] == 6
    assert_same(out, reference["longer"])


def test_corrupted_block_is_reported_and_recomputed(
    llm: Any, vault: VaultProcess, reference: dict[str, Output]
) -> None:
    store_then_forget(llm, CORRUPTED)
    conn = scheduler_connector(llm)
    probe = probe_request(CORRUPTED, "probe-corrupted")
    key = conn.keybook.keys(probe)[3]
    namespace = conn.identity.stream_namespace(conn.topology.streams[0])
    with VaultClient(vault.address) as client:
        (blob,) = client.get(namespace, [key])
        assert blob is not None
        tampered = bytearray(blob)
        tampered[-1] ^= 0xFF
        assert client.put(namespace, {key: bytes(tampered)}) == 1

    out, seen = generate_counted(llm, CORRUPTED)
    assert seen["load_errors"] == 1
    assert seen["restored_blocks"] == 8
    assert seen["load_landed_blocks"] == 9, "the bad block too landed in its row, then was recomputed"
    assert_same(out, reference["corrupted"])
    with VaultClient(vault.address) as client:
        (healed,) = client.get(namespace, [key])
    assert healed is not None, "the recomputed block was not stored again"
    decode_tensor(healed)
    with pytest.raises(CorruptBlobError):
        decode_tensor(bytes(tampered))


def test_vault_down_recomputes_without_hanging(
    llm: Any, vault: VaultProcess, reference: dict[str, Output], request: pytest.FixtureRequest
) -> None:
    store_then_forget(llm, DOWN)
    vault.kill()
    try:
        out, seen = generate_counted(llm, DOWN)
    finally:
        revived = VaultProcess(vault.path, port=vault.port, max_bytes="256MiB").start()
        request.addfinalizer(lambda: revived.stop(timeout=10))
    assert seen.get("restored_blocks", 0) == 0
    assert seen.get("stored_blocks", 0) == 0
    assert_same(out, reference["down"])
