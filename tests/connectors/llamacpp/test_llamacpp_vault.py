"""LlamaTier through real vault processes on loopback: cold restores bit-identical to a full eval.

The writer, the reader and the reference are three ``Llama`` instances of one GGUF; the reader's tier
runs over a cluster connection of its own, so nothing but the vaults carries state from the writer.
Every check compares the greedy tokens and the logits of every step, bit for bit, with what llama.cpp
computes when it reuses that prefix from its own memory: a fresh ``Llama`` evaluates what the writer
evaluated, keeps the restored prefix and evaluates the rest. The greedy tokens must also be those of a
one-batch full eval of the prompt (whose low bits differ with flash attention: ggml's kernels round
differently when the batches differ).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (make test-llamacpp)")

from tests.conftest import VaultFactory
from tests.connectors.llamacpp.models import greedy, make_llm, model_file, prompt, reference
from tests.processes import stopped
from tierkv.client.cluster import Cluster
from tierkv.connectors.llamacpp import LlamaTier
from tierkv.connectors.llamacpp.engine import check_version
from tierkv.errors import UnsupportedStateError
from tierkv.vault.launcher import VaultProcess

pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(300)]

BLOCK = 16
LENGTH = 90  # 5 full blocks restorable, the rest computed


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture
def kv_vault(vault_factory: VaultFactory) -> VaultProcess:
    return vault_factory("kv", role="kv_cold")


def _cluster(vault: VaultProcess, timeout: float = 5.0) -> Cluster:
    return Cluster({"kv_cold": [vault.address]}, timeout=timeout)


@pytest.fixture
def cluster(kv_vault: VaultProcess) -> Iterator[Cluster]:
    c = _cluster(kv_vault)
    yield c
    c.close()


def _store(path: Path, cluster: Cluster, ids: list[int], **kw: Any) -> LlamaTier:
    """Evaluate ``ids`` in a writer ``Llama`` and ship its blocks; returns the writer's tier (closed)."""
    llm = make_llm(path, **kw)
    tier = LlamaTier(llm, cluster, block_size=BLOCK)
    greedy(llm, ids, steps=0)
    assert tier.store() and tier.flush(60)
    tier.close()
    llm.close()
    return tier


def _same_as_full_eval(
    run: Any, path: Path, ids: list[int], restored: int, held: list[int] | None = None, **kw: Any
) -> None:
    """``run`` is llama.cpp's own reuse of the ``restored`` prefix of what the writer held, bit for bit,
    and its tokens a one-batch full eval's."""
    assert run.same_as(reference(path, ids, held=held or ids, keep=restored, **kw))
    assert run.tokens == reference(path, ids, **kw).tokens


def _restore(path: Path, vault: VaultProcess, ids: list[int], **kw: Any) -> tuple[int, int, Any]:
    """A fresh reader: restore ``ids`` from the vaults, then the greedy run of the rest."""
    timeout = kw.pop("timeout", 5.0)
    llm = make_llm(path, **kw)
    with _cluster(vault, timeout) as reader:
        tier = LlamaTier(llm, reader, block_size=BLOCK)
        got = tier.restore(ids)
        assert llm.n_tokens == got.tokens
        run = greedy(llm, ids[got.tokens :])
        tier.close()
    llm.close()
    return got.tokens, got.rejected, run


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
@pytest.mark.parametrize("flash", [True, False], ids=["fa", "no-fa"])
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_cold_restore_is_bit_identical_to_a_full_eval(
    size: str, flash: bool, kv: str, models: Path, cluster: Cluster, kv_vault: VaultProcess
) -> None:
    path = model_file(models, size)
    ids = prompt(LENGTH, seed=3)
    writer = _store(path, cluster, ids, flash=flash, kv=kv)
    assert writer.stored.stored == writer.stored.sent == LENGTH // BLOCK
    restored, rejected, run = _restore(path, kv_vault, ids, flash=flash, kv=kv)
    assert (restored, rejected) == (LENGTH // BLOCK * BLOCK, 0)
    _same_as_full_eval(run, path, ids, restored, flash=flash, kv=kv)


def test_q4_0_kv_round_trips_bit_for_bit(models: Path, cluster: Cluster, kv_vault: VaultProcess) -> None:
    path = model_file(models, "tiny")
    ids = prompt(LENGTH, seed=4)
    _store(path, cluster, ids, kv="q4_0")
    restored, _, run = _restore(path, kv_vault, ids, kv="q4_0")
    assert restored == 80
    _same_as_full_eval(run, path, ids, restored, kv="q4_0")


def test_a_longer_prompt_reuses_the_stored_prefix_and_stores_only_its_new_blocks(
    models: Path, cluster: Cluster, kv_vault: VaultProcess
) -> None:
    path = model_file(models, "tiny")
    ids = prompt(LENGTH, seed=5)
    _store(path, cluster, ids)
    longer = ids + prompt(40, seed=6)[1:]
    restored, _, run = _restore(path, kv_vault, longer)
    assert restored == 80
    _same_as_full_eval(run, path, longer, restored, held=ids)
    again = _store(path, cluster, longer)
    assert again.stored.sent == len(longer) // BLOCK - LENGTH // BLOCK, "only the blocks the vaults lack"


def test_kv_types_and_flash_attention_never_share_blocks(models: Path, cluster: Cluster) -> None:
    path = model_file(models, "tiny")
    spaces = set()
    for flash, kv in [(True, "f16"), (False, "f16"), (True, "q8_0")]:
        llm = make_llm(path, flash=flash, kv=kv)
        tier = LlamaTier(llm, cluster, block_size=BLOCK)
        spaces.add(tier.namespace.digest)
        tier.close()
        llm.close()
    assert len(spaces) == 3


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_block_is_recomputed_with_identical_output(
    damage: str, models: Path, cluster: Cluster, kv_vault: VaultProcess
) -> None:
    path = model_file(models, "tiny")
    ids = prompt(LENGTH, seed=7)
    writer = _store(path, cluster, ids)
    ns, key = writer.namespace.digest, writer.keys(ids, 3)[2]
    if damage == "corrupt":
        blob = bytearray(cluster.get(ns, [key])[0] or b"")
        assert blob, "the blob to corrupt is not stored"
        blob[len(blob) // 2] ^= 0x01
        assert cluster.put(ns, {key: bytes(blob)}).stored == 1
    else:
        assert cluster.delete(ns, [key]) == 1
    restored, rejected, run = _restore(path, kv_vault, ids)
    assert restored == 2 * BLOCK, "the leading run before the damaged block"
    assert rejected == (damage == "corrupt")
    _same_as_full_eval(run, path, ids, restored)
    assert cluster.get(ns, [key]) == [None], "a corrupt blob is deleted"


def test_a_hung_vault_is_a_miss_within_its_deadline(
    models: Path, cluster: Cluster, kv_vault: VaultProcess
) -> None:
    path = model_file(models, "tiny")
    ids = prompt(LENGTH, seed=8)
    _store(path, cluster, ids)
    with stopped(kv_vault):  # accepts connections, never answers: only the deadline ends the wait
        restored, rejected, run = _restore(path, kv_vault, ids, timeout=1.0)
    assert (restored, rejected) == (0, 0)
    _same_as_full_eval(run, path, ids, restored)


def test_a_context_that_already_holds_the_prefix_fetches_nothing(
    models: Path, cluster: Cluster, kv_vault: VaultProcess
) -> None:
    path = model_file(models, "tiny")
    ids = prompt(LENGTH, seed=9)
    _store(path, cluster, ids)
    llm = make_llm(path)
    tier = LlamaTier(llm, cluster, block_size=BLOCK)
    greedy(llm, ids, steps=0)
    got = tier.restore(ids)
    assert (got.tokens, got.found, llm.n_tokens) == (0, 0, LENGTH), "memory already beats the vaults"
    tier.close()
    llm.close()


@pytest.mark.parametrize("version", ["0.3.35", "0.4.0", "1.0.0", "unknown"])
def test_untested_llama_cpp_python_releases_are_refused(version: str) -> None:
    with pytest.raises(UnsupportedStateError, match=f"llama-cpp-python {version}: tierkv reads"):
        check_version(version)
