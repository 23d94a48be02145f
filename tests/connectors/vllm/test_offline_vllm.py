"""Offline ``LLM.generate`` with vLLM's default engine process stores without any stepping by the user.

vLLM 0.32's engine core, in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING``, the default), keeps
stepping while ``Scheduler.has_requests()`` is true, which includes the connector's
``has_pending_push_work()``: blocks held for a store are shipped and released after ``generate`` returns.
It does so at shutdown too: on SIGTERM the core steps until ``has_work()`` is false (within the 5 s vLLM
grants it before a kill), so a script that exits right after ``generate`` still ships its stores.
(The in-process engine that the other tests use steps only inside ``generate``; see ``engine.drain``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm builds .venv-vllm)")

from tests.connectors.vllm.engine import (
    BLOCK_SIZE,
    keys_in,
    make_llm,
    module_vault,
    prompt,
    shutdown,
    write_tiny_llama,
)
from tierkv.vault.launcher import VaultProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPT = prompt(21, 300)  # 9 full blocks
BLOCKS = 9
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VaultProcess]:
    yield from module_vault(tmp_path_factory.mktemp("vault-offline"))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "m")


@pytest.fixture(scope="module")
def llm(model: Path, vault: VaultProcess) -> Iterator[Any]:
    """An engine whose core runs in its own process, as ``LLM`` does by default."""
    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    try:
        engine = make_llm(Path(model), {"kv_cold": vault.address, "timeout": 1.0})
    finally:
        if saved is None:
            del os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved
    yield engine
    shutdown(engine)


def cached_tokens(llm: Any, tokens: list[int]) -> tuple[list[int], int]:
    """Greedy output of ``tokens`` and the prompt tokens that did not have to be computed."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=8, temperature=0.0)
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=tokens)], params, use_tqdm=False)
    return list(out.outputs[0].token_ids), int(out.num_cached_tokens or 0)


def test_generate_then_reset_restores_from_the_vault(llm: Any) -> None:
    first, cached = cached_tokens(llm, PROMPT)
    assert cached == 0
    # No engine step from here: the engine process ships the store and releases the held blocks by
    # itself; until then vLLM refuses to reset its prefix cache (blocks still held).
    deadline = time.monotonic() + 60
    while not llm.reset_prefix_cache():
        assert time.monotonic() < deadline, "the engine never released the blocks held for the store"
        time.sleep(0.05)
    second, cached = cached_tokens(llm, PROMPT)
    assert cached == BLOCKS * BLOCK_SIZE, "the second request was not restored from the vault"
    assert second == first


def test_a_script_that_exits_right_after_generate_still_ships_its_stores(
    model: Path, vault: VaultProcess, tmp_path: Path
) -> None:
    tokens = prompt(22, 300)  # 9 full blocks no other test stores
    (tmp_path / "prompts.json").write_text(json.dumps([tokens]))
    before = keys_in(vault)
    subprocess.run(
        [
            sys.executable, "-m", "tests.connectors.vllm.engine", "--model", str(model),
            "--prompts", str(tmp_path / "prompts.json"), "--out", str(tmp_path / "out.json"),
            "--kv-cold", vault.address,
        ],
        cwd=REPO,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    assert json.loads((tmp_path / "out.json").read_text())[0][0], "the script generated nothing"
    assert keys_in(vault) - before == BLOCKS, "the engine exited before its stores reached the vault"
