"""Every engine hook on every backend: the conformance kit (tests/conformance/kit.py says what it checks).

Cases: the toy hook (tests/conformance/toy_hook.py, the template) and the transformers hook on a tiny
random-weight model. Hooks whose engines need their own environment have a module of their own here
(``test_llamacpp.py``, ...), marked for their tier; the checks themselves are in ``suite.py``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from tests.conformance.kit import Driver, HookCase
from tests.conformance.suite import KitSuite
from tests.conformance.toy_hook import ToyEngine, ToyHook
from tierkv.tiering import Storage


class ToyDriver(Driver):
    def __init__(self, engine: ToyEngine, storage: Storage) -> None:
        self.hook = ToyHook(engine, storage)
        self.namespace = self.hook.spec.namespace

    def run(self, tokens: Sequence[int], layout: list[dict[str, Any]] | None = None) -> Any:
        return self.hook.run(tokens, layout)

    def restored_tokens(self) -> int:
        return self.hook.last.restored_tokens

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        return self.hook.keys(tokens)

    def lookup(self, tokens: Sequence[int]) -> int:
        return self.hook.lookup(tokens)

    def finish(self, tokens: Sequence[int], blocks: int) -> Any:
        cache = np.zeros((len(tokens), 2, 2, 2, 8), np.float32)
        start = self.hook.load(tokens, blocks, cache)
        self.hook.last.restored_tokens = start
        self.hook.engine.kv_rows(tokens, start, cache)
        return self.hook.engine.next_token(cache, len(tokens))

    def close(self) -> None:
        self.hook.close()


class ToyCase(HookCase):
    name = "toy"
    block_tokens = 16
    splits_lookup = True

    def __init__(self) -> None:
        self.engine = ToyEngine(self.block_tokens)

    def open(self, storage: Storage) -> Driver:
        return ToyDriver(self.engine, storage)

    def reference(self, tokens: Sequence[int]) -> Any:
        return self.engine.reference(tokens)


class HFDriver(Driver):
    def __init__(self, model: Any, storage: Storage) -> None:
        from tierkv.connectors.hf import TieredSession

        self.session = TieredSession(model, storage, block_size=HFCase.block_tokens)
        self.namespace = self.session.namespace

    def run(self, tokens: Sequence[int], layout: list[dict[str, Any]] | None = None) -> Any:
        import torch

        out = self.session.generate(torch.tensor([list(tokens)]), max_new_tokens=HFCase.new, layout=layout)
        assert self.session.persist(timeout=30)
        return out

    def restored_tokens(self) -> int:
        return int(self.session.last_stats.restored_tokens)

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        from tierkv.connectors.hf.hot import as_tokens

        return self.session.streams.kv_keys(as_tokens(list(tokens)), len(tokens) // HFCase.block_tokens)

    def close(self) -> None:
        self.session.close()


class HFCase(HookCase):
    name = "transformers"
    block_tokens = 16
    new = 4

    def __init__(self) -> None:
        self._model: Any = None

    @property
    def model(self) -> Any:
        if self._model is None:
            from tests.connectors.hf.models import tiny_model

            self._model = tiny_model("llama")
        return self._model

    def open(self, storage: Storage) -> Driver:
        return HFDriver(self.model, storage)

    def reference(self, tokens: Sequence[int]) -> Any:
        import torch

        from tests.connectors.hf.models import reference

        return reference(self.model, torch.tensor([list(tokens)]), self.new)

    def same(self, a: Any, b: Any) -> bool:
        import torch

        return bool(torch.equal(a, b))


CASES = [ToyCase(), HFCase()]


class TestKit(KitSuite):
    @pytest.fixture(params=CASES, ids=lambda c: c.name)
    def case(self, request: pytest.FixtureRequest) -> HookCase:
        return request.param  # type: ignore[no-any-return]
