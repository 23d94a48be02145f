"""A real vLLM engine on CPU with a tiny random-weight Llama, for the connector's engine tests.

The checkpoint is written locally (config.json + safetensors with seeded random weights scaled like a
trained model), so nothing is downloaded and the model is sharp enough that a wrong KV block changes
the greedy tokens. vLLM's ``load_format="dummy"`` was tried first: its weights are so small that the
logits stay uniform and a zeroed KV block leaves the output unchanged, which would hide broken restores.

Run as a module it writes the outputs of an engine without any connector (the reference), or with
TierKVConnector storing into a vault (``--kv-cold HOST:PORT``), and exits without shutting the engine down,
as a batch script does::

    python -m tests.connectors.vllm.engine --model DIR --prompts prompts.json --out out.json [--kv-cold ADDR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierkv.connectors.vllm import CONNECTOR_NAME, MODULE_PATH
from tierkv.connectors.vllm.stats import merge

if TYPE_CHECKING:
    from tierkv.vault.launcher import VaultProcess

BLOCK_SIZE = 32
MAX_MODEL_LEN = 1024
HIDDEN, LAYERS, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 128, 2, 1000, 4, 2, 32

Output = tuple[list[int], list[float]]
"""Greedy token ids and the logprob of each chosen token."""


def llama_config(
    *,
    layers: int = LAYERS,
    hidden: int = HIDDEN,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
) -> dict[str, Any]:
    """``config.json`` of a small float32 Llama (default: 2 layers, 2 KV heads of 32)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "torch_dtype": "float32",
    }


def write_tiny_llama(
    path: Path,
    seed: int = 1234,
    *,
    layers: int = LAYERS,
    hidden: int = HIDDEN,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
    max_positions: int = 2048,
) -> Path:
    """:func:`llama_config` with seeded weights and a word tokenizer; returns its directory.

    ``max_positions`` bounds the engine's ``max_model_len``: a caller with longer prompts raises it."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    config = llama_config(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    config |= {"rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}
    config["max_position_embeddings"] = max(config["max_position_embeddings"], max_positions)
    intermediate = config["intermediate_size"]
    (path / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(seed)

    def w(rows: int, cols: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn((rows, cols), generator=gen) * (scale / math.sqrt(cols))

    tensors = {
        "model.embed_tokens.weight": torch.randn((VOCAB, hidden), generator=gen),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": w(VOCAB, hidden, scale=4.0),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": w(intermediate, hidden),
            p + "mlp.up_proj.weight": w(intermediate, hidden),
            p + "mlp.down_proj.weight": w(hidden, intermediate),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    write_word_tokenizer(path)
    return path


def write_word_tokenizer(path: Path) -> None:
    """A word-level tokenizer (``t0`` .. ``t999``, anything else is ``t0``) so a server can take text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "t0",
        "bos_token": "t1",
        "eos_token": "t2",
        "model_max_length": MAX_MODEL_LEN,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def transfer_config(
    extra: dict[str, Any], connector: tuple[str, str] = (CONNECTOR_NAME, MODULE_PATH)
) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` that runs TierKVConnector (or ``connector``: a subclass's name and
    module) in both roles with ``extra``.

    ``kv_load_failure_policy`` is left at vLLM's default (``fail``): the tests of failed loads prove that
    the connector turns them into recomputes by itself.
    """
    name, module = connector
    return {
        "kv_connector": name,
        "kv_connector_module_path": module,
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def make_llm(
    model: Path,
    extra: dict[str, Any] | None = None,
    max_model_len: int = MAX_MODEL_LEN,
    connector: tuple[str, str] = (CONNECTOR_NAME, MODULE_PATH),
    **engine: Any,
) -> Any:
    """An in-process engine; with ``extra`` it runs TierKVConnector (or ``connector``, see
    :func:`transfer_config`) with that extra config.

    ``engine`` overrides vLLM engine arguments (dtype, block_size, mamba_cache_mode ...). The engine
    core runs in this process (so tests reach both connector halves) with a 1 GiB CPU KV cache; these
    settings are made here, not on import, so that importing the helpers leaves servers started by
    other tests on vLLM's defaults.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM
    from vllm.config import KVTransferConfig

    transfer = None if extra is None else KVTransferConfig(**transfer_config(extra, connector))
    args: dict[str, Any] = {
        "load_format": "safetensors",
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "dtype": "float32",
        "block_size": BLOCK_SIZE,
        "max_model_len": max_model_len,
        "seed": 0,
        **engine,
    }
    return LLM(model=str(model), kv_transfer_config=transfer, **args)


def module_vault(root: Path) -> Iterator[VaultProcess]:
    """A test module's vault under ``root`` (256 MiB), for a module-scoped fixture to ``yield from``."""
    from tierkv.vault.launcher import VaultProcess

    proc = VaultProcess(root / "kv", max_bytes="256MiB").start()
    yield proc
    proc.stop(timeout=10)


def keys_in(vault: VaultProcess) -> int:
    """How many keys ``vault`` holds (its ``Stats`` RPC)."""
    from tierkv.client.vault import VaultClient

    with VaultClient(vault.address) as client:
        return client.stats().keys


def write_tiny_qwen3_next(path: Path, seed: int = 0) -> Path:
    """A hybrid model: Qwen3-Next layout (gated delta-net linear attention + full attention, small MoE).

    The transformers tests' tiny Qwen3-Next (initialisation std 0.2, so the output depends visibly on
    every state), widened to the head sizes vLLM's CPU gated delta-net kernel supports and saved as
    safetensors in bfloat16, which that kernel requires.
    """
    import torch

    from tests.connectors.hf.models import tiny_model

    model = tiny_model(
        "qwen3_next",
        seed,
        torch.bfloat16,
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        max_position_embeddings=4096,
    )
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def sampling(max_tokens: int = 8, kv_transfer_params: dict[str, Any] | None = None) -> Any:
    """Greedy sampling with the chosen token's logprob; ``kv_transfer_params`` as the OpenAI server
    passes a request body's field of that name."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=1)
    if kv_transfer_params is not None:
        params.extra_args = {"kv_transfer_params": kv_transfer_params}
    return params


def output_of(out: Any) -> Output:
    """The greedy tokens and their logprobs of one ``RequestOutput``."""
    completion = out.outputs[0]
    chosen = [lp[t].logprob for t, lp in zip(completion.token_ids, completion.logprobs or [], strict=True)]
    return list(completion.token_ids), chosen


def generate(
    llm: Any, prompts: list[list[int]], max_tokens: int = 8, kv_transfer_params: dict[str, Any] | None = None
) -> list[Output]:
    from vllm.inputs import TokensPrompt

    params = sampling(max_tokens, kv_transfer_params)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [output_of(out) for out in outs]


def timed(llm: Any, prompt: list[int]) -> float:
    """Seconds for one request of one output token: the time to first token of an offline engine."""
    start = time.perf_counter()
    generate(llm, [prompt], max_tokens=1)
    return time.perf_counter() - start


def probe_request(tokens: list[int], request_id: str = "probe") -> Any:
    """A vLLM ``Request`` for ``tokens`` with the engine's default block hasher (sha256)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    return Request(
        request_id=request_id,
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
    )


def scheduler_connector(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core.scheduler.connector


def worker_connector() -> Any:
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group()


def connector_totals(llm: Any) -> dict[str, int]:
    """The connector's counters, scheduler and worker halves summed."""
    return merge(scheduler_connector(llm).totals(), worker_connector().totals())


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that changed from ``before`` to ``after``, by how much."""
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def generate_counted(llm: Any, tokens: list[int]) -> tuple[Output, dict[str, int]]:
    """One request, stepped until its stores are done: its output and the counters it moved."""
    before = connector_totals(llm)
    out = generate(llm, [tokens])[0]
    drain(llm)
    return out, delta(before, connector_totals(llm))


def store_then_forget(llm: Any, tokens: list[int]) -> tuple[Output, dict[str, int]]:
    """:func:`generate_counted` (storing the blocks of ``tokens``), then empty vLLM's own prefix cache."""
    out, moved = generate_counted(llm, tokens)
    assert llm.reset_prefix_cache(), "vLLM still holds blocks after the stores were reported done"
    return out, moved


def shutdown(llm: Any) -> None:
    """Stop an engine from :func:`make_llm` (its core holds threads and the connector's pools)."""
    llm.llm_engine.engine_core.shutdown()


def drain(llm: Any, timeout: float = 60.0) -> None:
    """Step the engine until the connector released every block it held for a store.

    An offline engine only steps while requests are unfinished; a server keeps stepping by itself
    (``has_pending_push_work``).
    """
    conn = scheduler_connector(llm)
    deadline = time.monotonic() + timeout
    while conn.has_pending_push_work():
        if time.monotonic() > deadline:
            raise TimeoutError("stores still pending")
        llm.llm_engine.step()
        time.sleep(0.001)


def prompt(seed: int, length: int) -> list[int]:
    """A deterministic pseudo-random prompt of token ids in [3, VOCAB)."""
    return [(seed * 7919 + i * 104729 + (i * i) % 97) % (VOCAB - 3) + 3 for i in range(length)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kv-cold", help="run TierKVConnector against this vault")
    args = parser.parse_args()
    prompts = json.loads(Path(args.prompts).read_text())
    llm = make_llm(Path(args.model), None if args.kv_cold is None else {"kv_cold": args.kv_cold})
    Path(args.out).write_text(json.dumps(generate(llm, prompts)))


if __name__ == "__main__":
    main()
