"""``tierkv bench --engine-api`` against a real ``vllm serve`` with TierKVConnector and a real vault.

The server runs a small random-weight Llama (``--load-format dummy``: timing needs the FLOPs, not the
words) with a byte-level BPE tokenizer this test trains on the bench's own prompt vocabulary, so text
prompts of a chosen length reach the engine. Run with the vLLM environment::

    .venv-vllm/bin/python -m pytest -m vllm tests/bench/test_engine_vllm.py

Elsewhere (no vLLM installed) the module is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from tests.conftest import VaultFactory
from tests.connectors.vllm.engine import transfer_config
from tests.ports import free_port
from tierkv.bench.engine import EngineSettings, run_engine
from tierkv.bench.prompts import PromptMaker
from tierkv.client.vault import VaultClient

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here (scripts/setup-vllm-env.sh builds .venv-vllm)", allow_module_level=True
    )

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BLOCK = 32
START_TIMEOUT_S = 300.0
MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def write_model(path: Path) -> Path:
    """config.json plus a BPE tokenizer trained here on sentences like the ones the bench sends."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path.mkdir(parents=True)
    maker = PromptMaker(seed=11)
    corpus = [maker.sentence() for _ in range(3000)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MODEL["vocab_size"],
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer)
    assert tokenizer.get_vocab_size() <= MODEL["vocab_size"]
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "<unk>",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "model_max_length": MODEL["max_position_embeddings"],
            }
        )
    )
    (path / "config.json").write_text(json.dumps(MODEL))
    return path


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    raise TimeoutError(f"vllm serve not ready after {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-4000:]}")


@pytest.fixture
def vllm_server(vault_factory: VaultFactory, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(base URL, vault address) of a vLLM server whose connector stores to a fresh vault."""
    vault = vault_factory(name="kv", max_bytes="512MiB")
    model = write_model(tmp_path / "model")
    port = free_port()
    transfer = transfer_config({"kv_cold": vault.address})
    args = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", "tiny-bench", "--load-format", "dummy",
        "--dtype", "float32", "--enforce-eager", "--block-size", str(BLOCK), "--max-model-len", "4096",
        "--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(port),
        "--kv-transfer-config", json.dumps(transfer),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
    log = tmp_path / "vllm.log"
    with open(log, "wb") as sink:
        # its own session, so the engine-core child it spawns is stopped with it (by this group's id)
        proc = subprocess.Popen(args, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log)
        yield url, vault.address
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_restored_ttft_beats_cold_through_real_vllm(vllm_server: tuple[str, str]) -> None:
    url, vault_address = vllm_server
    settings = EngineSettings(
        url=url, lengths=(1536,), repeats=2, max_tokens=2, evict="reset", settle_s=1.0, max_seconds=300
    )
    result = run_engine(settings, Console(quiet=True))
    assert result.ok, result.errors
    assert result.model == "tiny-bench" and result.api == "completions"
    assert result.evict_method == "POST /reset_prefix_cache"
    assert result.tokenizer == "engine /tokenize"
    (row,) = result.rows
    assert 1536 - 8 <= (row.prompt_tokens or 0) <= 1536
    # the engine itself says the restored request reused the prompt's full blocks
    assert row.cached_tokens_restored is not None
    assert row.cached_tokens_restored >= (row.tokens - 1) // BLOCK * BLOCK
    assert all(m.cached_tokens == 0 for m in row.cold)
    # and those blocks came from the vault
    with VaultClient(vault_address) as client:
        stats = client.stats()
    assert stats.hits >= 2 * ((row.tokens - 1) // BLOCK)
    f = row.figures()
    assert f["restored_ttft_s"] < f["cold_ttft_s"], result.document()["results"]
    assert not any("not hit" in w for w in result.warnings), result.warnings
