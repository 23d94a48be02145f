"""The conformance kit for SGLang's HiCache backend (:class:`~tierkv.connectors.sglang.TierKVStorage`).

SGLang's server cannot run here, so the engine is SGLang's own cache classes on CPU — a real
``MHATokenToKVPoolHost`` with SGLang's chained page hashes — and a request makes the calls its
``HiCacheController`` makes, in its order: ``batch_exists`` (the scheduler's prefetch check, leased),
``batch_get_v1`` into freshly allocated host pages (the controller keeps the leading run that arrived),
then ``batch_set_v1`` of the request's pages with its prefix keys. What the pages hold is a toy model's
KV: each page's bits follow from its chained hash (so from every token before it); the output is a
digest of every page the request ends up with, restored or computed, and of its last tokens, so a wrong
bit anywhere changes it.

The layout check is skipped: SGLang's storage interface hands a backend page hashes and prefix keys,
never the request, so there is no layout for the backend to tag pages with.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Sequence
from typing import Any

import pytest

if importlib.util.find_spec("sglang") is None:  # not imported here: the harness prepares torch for it first
    pytest.skip("SGLang is not installed here (make test-sglang)", allow_module_level=True)

import torch

from tests.conformance.kit import Driver, HookCase
from tests.conformance.suite import KitSuite
from tests.connectors.sglang.harness import Geometry, host_pool, page_hashes
from tierkv.connectors.sglang import TierKVStorage
from tierkv.tiering import Storage

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(600)]

from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

PAGE = 16
GEOMETRY = Geometry(page=PAGE)


def storage_config() -> Any:
    return HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="tiny-test-model",
        extra_config={"interface_v1": 1, "tierkv": {"kv_cold": "127.0.0.1:1", "lookup_lease_ms": 10_000}},
    )


def fill_page(page: torch.Tensor, page_hash: str) -> None:
    """The toy model's KV of one page: random bits seeded by its chained hash."""
    gen = torch.Generator().manual_seed(int(page_hash[:15], 16))
    bits = torch.randint(-(2**15), 2**15, page.shape, generator=gen, dtype=torch.int16)
    page.copy_(bits.view(page.dtype))


def output(pages: Sequence[torch.Tensor], tokens: Sequence[int]) -> str:
    """The request's answer: a digest of every page's bits and of the tokens after the last page."""
    digest = hashlib.sha256()
    for page in pages:
        digest.update(page.contiguous().view(torch.int16).numpy().tobytes())
    digest.update(repr(list(tokens[len(pages) * PAGE :])).encode())
    return digest.hexdigest()


class SglangDriver(Driver):
    def __init__(self, storage: Storage) -> None:
        _, self.host = host_pool("page_first", GEOMETRY)
        self.backend = TierKVStorage(storage_config(), {}, storage=storage)
        self.backend.register_mem_pool_host(self.host)
        assert self.backend.kv is not None
        self.stream = self.backend.kv
        self.namespace = self.stream.spec.namespace
        self.restored = 0
        self.acked = 0
        """Pages of the last backup a vault acknowledged."""

    def hashes(self, tokens: Sequence[int]) -> list[str]:
        return page_hashes(list(tokens[: len(tokens) // PAGE * PAGE]), PAGE)

    def page(self, start: int) -> torch.Tensor:
        return self.host.get_data_page(start, flat=False)

    def lookup(self, tokens: Sequence[int]) -> int:
        """The scheduler's prefetch check: leading pages held, short of the last token's page."""
        return self.backend.batch_exists(self.hashes(tokens)[: (len(tokens) - 1) // PAGE])

    def finish(self, tokens: Sequence[int], blocks: int) -> str:
        """The controller's prefetch of ``blocks`` pages, the rest computed, then the backup."""
        hashes = self.hashes(tokens)
        pages: list[torch.Tensor] = []
        if blocks:
            at = self.host.alloc(blocks * PAGE)
            got = self.backend.batch_get_v1(hashes[:blocks], at)
            leading = next((i for i, ok in enumerate(got) if not ok), blocks)
            pages = [self.page(int(s)).clone() for s in at[: leading * PAGE : PAGE].tolist()]
            self.host.free(at)
        self.restored = len(pages) * PAGE
        at = self.host.alloc(len(hashes) * PAGE)
        for n, start in enumerate(at[::PAGE].tolist()):
            if n < len(pages):
                self.page(int(start)).copy_(pages[n])
            else:
                fill_page(self.page(int(start)), hashes[n])
        out = output([self.page(int(s)) for s in at[::PAGE].tolist()], tokens)
        self.acked = sum(self.backend.batch_set_v1(hashes, at, HiCacheStorageExtraInfo(prefix_keys=[])))
        self.host.free(at)
        return out

    def run(self, tokens: Sequence[int], layout: list[dict[str, Any]] | None = None) -> str:
        return self.finish(tokens, self.lookup(tokens))

    def restored_tokens(self) -> int:
        return self.restored

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        return self.stream.keys(self.hashes(tokens))

    def close(self) -> None:
        """``batch_set_v1`` returns once the vaults answered; the storage is the kit's to close."""
        self.stream.tier.close()


class SglangCase(HookCase):
    name = "sglang"
    block_tokens = PAGE
    splits_lookup = True
    without_layout = "SGLang's storage interface passes page hashes and prefix keys, never the request"

    def open(self, storage: Storage) -> Driver:
        return SglangDriver(storage)

    def reference(self, tokens: Sequence[int]) -> str:
        hashes = page_hashes(list(tokens[: len(tokens) // PAGE * PAGE]), PAGE)
        _, host = host_pool("page_first", GEOMETRY)
        at = host.alloc(len(hashes) * PAGE)
        pages = [host.get_data_page(int(s), flat=False) for s in at[::PAGE].tolist()]
        for page, page_hash in zip(pages, hashes, strict=True):
            fill_page(page, page_hash)
        return output(pages, tokens)


class TestSglang(KitSuite):
    @pytest.fixture
    def case(self) -> HookCase:
        return SglangCase()
