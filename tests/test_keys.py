"""Namespaces and chained block keys: deterministic everywhere, distinct wherever KV differs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tierkv.keys import (
    KEY_LEN,
    ROOT_KEY,
    Namespace,
    block_keys,
    model_fingerprint,
    namespace_from_config,
    wrap_engine_hashes,
)

CONFIG: dict[str, Any] = {
    "_name_or_path": "Qwen/Qwen2.5-0.5B",
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "hidden_size": 896,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}


def base() -> Namespace:
    return Namespace.from_config(CONFIG, codec="int8", block_size=16, tenant="acme")


def test_namespace_digest_is_32_bytes_and_stable() -> None:
    ns = base()
    assert len(ns.digest) == KEY_LEN and ns.digest == base().digest
    assert ns.dtype == "bfloat16" and ns.model == "Qwen/Qwen2.5-0.5B"
    assert Namespace.from_dict(ns.to_dict()) == ns
    assert hash(ns) == hash(base()) and len({ns, base()}) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"model": "Qwen/Qwen2.5-0.5B-Instruct"},
        {"model_fingerprint": "0" * 64},
        {"dtype": "float16"},
        {"codec": "raw"},
        {"layout": 2},
        {"layout": "hf-v1/bs16"},
        {"tp_rank": 1, "tp_world": 2},
        {"tp_world": 2},
        {"pp_rank": 1, "pp_world": 2},
        {"tenant": "globex"},
        {"salt": "reset-2024"},
        {"extra": {"engine": "vllm-0.32"}},
    ],
)
def test_any_difference_gives_another_namespace(change: dict[str, Any]) -> None:
    ns = base()
    other = dataclasses.replace(ns, **change)
    assert other.digest != ns.digest and other != ns
    assert other.root_key != ns.root_key
    tokens = list(range(32))
    assert set(block_keys(tokens, 16, namespace=ns)).isdisjoint(block_keys(tokens, 16, namespace=other))
    assert set(wrap_engine_hashes(ns, [b"h" * 32])).isdisjoint(wrap_engine_hashes(other, [b"h" * 32]))


def test_equivalent_spellings_share_a_namespace() -> None:
    ns = base()
    assert dataclasses.replace(ns, dtype="torch.bfloat16") == ns
    assert dataclasses.replace(ns, dtype="BF16") == ns
    assert dataclasses.replace(ns, codec="INT8") == ns


@pytest.mark.parametrize(
    "field",
    ["num_hidden_layers", "num_key_value_heads", "head_dim", "rope_theta", "sliding_window", "layer_types"],
)
def test_fingerprint_follows_kv_shaping_fields(field: str) -> None:
    changed = {**CONFIG, field: 7}
    assert model_fingerprint(changed) != model_fingerprint(CONFIG)
    nested = {"text_config": CONFIG}
    assert model_fingerprint({"text_config": changed}) != model_fingerprint(nested)


def test_fingerprint_ignores_fields_that_do_not_shape_kv() -> None:
    assert model_fingerprint({**CONFIG, "vocab_size": 1, "use_cache": False}) == model_fingerprint(CONFIG)
    assert model_fingerprint(CONFIG, block_size=16) != model_fingerprint(CONFIG, block_size=32)
    reordered = dict(reversed(list(CONFIG.items())))
    assert model_fingerprint(reordered) == model_fingerprint(CONFIG)


def test_from_config_sources_and_errors() -> None:
    ns = namespace_from_config(CONFIG, codec="int8", block_size=16, tenant="acme")
    assert ns == base()
    assert Namespace.from_config({**CONFIG, "kv_cache_dtype": "fp8"}).dtype == "fp8"
    assert Namespace.from_config({**CONFIG, "kv_cache_dtype": "auto"}).dtype == "bfloat16"
    assert Namespace.from_config(CONFIG, dtype="float16").dtype == "float16"
    assert Namespace.from_config(CONFIG, model="local/ckpt").model == "local/ckpt"
    with pytest.raises(ValueError, match="model"):
        Namespace.from_config({"torch_dtype": "float16"})
    with pytest.raises(ValueError, match="dtype"):
        Namespace.from_config({"model": "m"})
    with pytest.raises(ValueError, match="rank"):
        Namespace(model="m", dtype="float16", codec="raw", tp_rank=2, tp_world=2)
    with pytest.raises(ValueError):
        Namespace(model="", dtype="float16", codec="raw")


def test_block_keys_cover_full_blocks_and_chain() -> None:
    tokens = list(range(100, 150))  # 3 full blocks of 16 and 2 tokens left over
    keys = block_keys(tokens, 16)
    assert len(keys) == 3 and all(len(k) == KEY_LEN for k in keys) and len(set(keys)) == 3
    assert block_keys(tokens[:48], 16) == keys
    assert block_keys(tokens[:47], 16) == keys[:2]
    assert block_keys([], 16) == [] and block_keys(tokens[:15], 16) == []
    # a key names the whole prefix: changing an early token changes every later key
    changed = [*tokens[:3], 9999, *tokens[4:]]
    other = block_keys(changed, 16)
    assert all(a != b for a, b in zip(keys, other, strict=True))
    # ...while a change in block 2 leaves blocks 0 and 1 alone
    late = [*tokens[:40], 9999, *tokens[41:]]
    assert block_keys(late, 16)[:2] == keys[:2] and block_keys(late, 16)[2] != keys[2]
    # continuing a chain from a parent equals hashing the whole sequence
    assert block_keys(tokens[16:48], 16, parent=keys[0]) == keys[1:]
    # the same block after another prefix is another key
    assert block_keys(tokens[16:32], 16)[0] != keys[1]


def test_block_keys_spec_is_sha256_of_parent_tokens_and_extra() -> None:
    tokens = [1, 2**40, -3, 7]
    (key,) = block_keys(tokens, 4, extra=b"lora:7")
    packed = np.array(tokens, "<i8").tobytes()
    h = hashlib.sha256(b"tierkv/block/v1\x00")
    for part in (ROOT_KEY, (4).to_bytes(8, "little"), packed, (6).to_bytes(8, "little"), b"lora:7"):
        h.update(part)
    assert key == h.digest()
    assert hashlib.sha256(b"tierkv/block-root/v1\x00").digest() == ROOT_KEY


def test_block_keys_inputs() -> None:
    tokens = list(range(64))
    keys = block_keys(tokens, 16)
    assert block_keys(np.arange(64, dtype=np.int32), 16) == keys
    assert block_keys(np.arange(64, dtype=np.uint64), 16) == keys
    assert block_keys(tuple(tokens), 16) == keys
    assert block_keys(tokens, 16, extra=b"x") != keys
    assert block_keys(tokens, 8)[1] != keys[0]  # other block size, other chain
    ns = base()
    assert block_keys(tokens, 16, namespace=ns) != keys
    assert block_keys(tokens, 16, namespace=ns)[0] == block_keys(tokens[:16], 16, parent=ns.root_key)[0]
    with pytest.raises(ValueError):
        block_keys(tokens, 0)
    with pytest.raises(ValueError):
        block_keys(tokens, 16, parent=b"short")
    with pytest.raises(ValueError):
        block_keys([0.5, 1.5], 1)  # type: ignore[list-item]
    with pytest.raises(ValueError):
        block_keys([[1, 2]], 1)  # type: ignore[list-item]
    with pytest.raises(ValueError):
        block_keys(np.array([2**64 - 1], np.uint64), 1)


def test_wrap_engine_hashes() -> None:
    ns = base()
    hashes = [hashlib.sha256(bytes([i])).digest() for i in range(4)]
    wrapped = wrap_engine_hashes(ns, hashes)
    assert len(wrapped) == 4 and all(len(k) == KEY_LEN for k in wrapped) and len(set(wrapped)) == 4
    assert wrapped == wrap_engine_hashes(ns, [bytearray(h) for h in hashes])
    assert not set(wrapped) & set(hashes)
    assert wrap_engine_hashes(ns, []) == []
    with pytest.raises(TypeError):
        wrap_engine_hashes(ns, [12345])  # type: ignore[list-item]


_CHILD = """
import json, sys
from tierkv.keys import Namespace, block_keys, wrap_engine_hashes
cfg = json.loads(sys.argv[1])
ns = Namespace.from_config(cfg, codec="int8", block_size=16, tenant="acme")
out = {
    "hash": hash("tierkv"),
    "ns": ns.hex,
    "blocks": [k.hex() for k in block_keys(list(range(1000)), 16, namespace=ns, extra=b"lora")],
    "engine": [k.hex() for k in wrap_engine_hashes(ns, [bytes(32), b"\\x01" * 32])],
}
print(json.dumps(out))
"""


def test_keys_are_identical_across_processes_with_different_hash_seeds() -> None:
    results = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(CONFIG)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        results.append(json.loads(proc.stdout))
    assert results[0]["hash"] != results[1]["hash"]  # the seeds really differ...
    for field in ("ns", "blocks", "engine"):
        assert results[0][field] == results[1][field]  # ...and our keys do not care
    ns = base()
    assert results[0]["ns"] == ns.hex
    assert results[0]["blocks"] == [
        k.hex() for k in block_keys(list(range(1000)), 16, namespace=ns, extra=b"lora")
    ]
