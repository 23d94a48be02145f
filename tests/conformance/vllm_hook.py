"""vLLM's engine, with :class:`~tierkv.connectors.vllm.TierKVConnector` given the kit's storage, as a kit
:class:`~tests.conformance.kit.HookCase` (``test_vllm.py`` runs it).

vLLM builds its connector itself, from ``kv_transfer_config`` (class name and module path), so the
storage comes in the way a user's would come in: through a subclass loaded by that module path.
:class:`KitConnector` is ``TierKVConnector`` with its one storage seam, ``open_storage``, answering the
kit's storage, and a record of what vLLM's scheduler told its workers (the tokens each request had in its
cache when it was first computed). Everything else — lookups on the scheduler side, loads and stores on
the worker side, the load-failure policy, the layout read from ``kv_transfer_params`` — is the
connector's own code, in a real engine (CPU, tiny random-weight Llama).

One engine serves every driver of a test module (an engine takes seconds to build): opening a driver
empties vLLM's prefix cache and forgets the connector's lookups (``reset_prefix_cache``, connector
included), so a request finds in the engine nothing but what it loads, and points the connector at the
test's storage through a :class:`Relay`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from tests.conformance.kit import Driver, HookCase
from tests.connectors.vllm.engine import (
    BLOCK_SIZE,
    Output,
    drain,
    make_llm,
    output_of,
    probe_request,
    sampling,
    scheduler_connector,
    shutdown,
)
from tests.connectors.vllm.reference import ReferenceEngine
from tierkv.connectors.vllm.connector import TierKVConnector
from tierkv.connectors.vllm.hints import TRANSFER_KEY
from tierkv.tiering import LazyStorage, Storage

NEW_TOKENS = 4
EXTRA = {"kv_cold": "127.0.0.1:1", "lookup_lease_ms": 10_000}
"""The connector's settings. ``kv_cold`` is required and never dialled (:meth:`KitConnector.open_storage`
answers the kit's storage); the lease is the vaults' longest, so a slow flood cannot outlast it."""
LOOKUP_TIMEOUT_S = 60.0


class Relay(LazyStorage):
    """The storage of the driver open now; the kit's backends own their storages and close them."""

    def __init__(self) -> None:
        super().__init__(self.get)
        self.target: Storage | None = None
        self.stray = 0
        """Calls made while no driver was open (each a miss to the connector): there must be none."""

    def get(self) -> Storage:
        if self.target is None:
            self.stray += 1
            raise ConnectionError("the connector used its storage while no kit driver was open")
        return self.target

    def close(self) -> None:
        """Nothing: the connector's shutdown does not close the kit's storages."""


class KitConnector(TierKVConnector):
    """``TierKVConnector`` over the kit's storage, recording what vLLM computes."""

    relay: ClassVar[Relay] = Relay()
    cached: ClassVar[dict[str, int]] = {}
    """Tokens each request had in vLLM's cache when it was first scheduled to compute (from the
    scheduler's output to the workers): with the prefix cache emptied, the tokens it loaded."""

    def open_storage(self) -> Storage:
        return self.relay

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        for new in scheduler_output.scheduled_new_reqs:
            self.cached.setdefault(new.req_id, new.num_computed_tokens)
        return super().build_connector_meta(scheduler_output)


class KitEngine:
    """A vLLM engine running :class:`KitConnector`, one request at a time."""

    def __init__(self, model: Path) -> None:
        self.llm = make_llm(model, EXTRA, connector=(KitConnector.__name__, __name__))
        self.connector = scheduler_connector(self.llm)
        self.namespace: bytes = self.connector.identity.stream_namespace(self.connector.topology.streams[0])
        self._ids = itertools.count()

    def open(self, storage: Storage) -> None:
        assert self.llm.reset_prefix_cache(reset_connector=True), "vLLM still holds blocks of a request"
        assert KitConnector.relay.stray == 0, "the connector reached for a storage between drivers"
        KitConnector.relay.target = storage

    def close(self) -> None:
        drain(self.llm)
        KitConnector.relay.target = None

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        probe = probe_request(list(tokens), f"kit-keys-{next(self._ids)}")
        try:
            return list(self.connector.keybook.keys(probe))
        finally:
            self.connector.keybook.forget(probe.request_id)

    def submit(self, tokens: Sequence[int], layout: list[dict[str, Any]] | None = None) -> str:
        """Add a request as ``LLM.generate`` does (the connector looks it up on arrival); its id."""
        from vllm.inputs import TokensPrompt

        params = sampling(NEW_TOKENS, None if layout is None else {TRANSFER_KEY: {"layout": layout}})
        prompt = TokensPrompt(prompt_token_ids=list(tokens))
        return str(self.llm.llm_engine.add_request(f"kit-{next(self._ids)}", prompt, params))

    def matched(self, req_id: str) -> int:
        """The connector's answer to vLLM's ``get_num_new_matched_tokens`` for a request not yet
        scheduled (side-effect free, vLLM may ask it any number of times), once its lookup is in."""
        scheduler = self.llm.llm_engine.engine_core.engine_core.scheduler
        request = scheduler.requests[req_id]
        deadline = time.monotonic() + LOOKUP_TIMEOUT_S
        while (answer := self.connector.get_num_new_matched_tokens(request, 0)[0]) is None:
            assert time.monotonic() < deadline, "the lookup did not finish"
            time.sleep(0.001)
        return int(answer)

    def finish(self, req_id: str) -> tuple[Output, int]:
        """Step the engine until the request is done and its stores are acknowledged: its output and the
        tokens it took from the cold tier."""
        done: list[Any] = []
        while self.llm.llm_engine.has_unfinished_requests():
            done += [out for out in self.llm.llm_engine.step() if out.finished]
        (out,) = done
        drain(self.llm)
        return output_of(out), KitConnector.cached.pop(req_id)

    def shutdown(self) -> None:
        shutdown(self.llm)


class VllmDriver(Driver):
    def __init__(self, engine: KitEngine, storage: Storage) -> None:
        engine.open(storage)
        self.engine = engine
        self.namespace = engine.namespace
        self.restored = 0
        self.looked_up: str | None = None

    def run(self, tokens: Sequence[int], layout: list[dict[str, Any]] | None = None) -> Output:
        out, self.restored = self.engine.finish(self.engine.submit(tokens, layout))
        return out

    def lookup(self, tokens: Sequence[int]) -> int:
        """The request arrives and the connector looks it up (leased); vLLM has not scheduled it yet."""
        self.looked_up = self.engine.submit(tokens)
        return self.engine.matched(self.looked_up) // BLOCK_SIZE

    def finish(self, tokens: Sequence[int], blocks: int) -> Output:
        """vLLM schedules the request: the connector answers from its lookup, the worker loads."""
        assert self.looked_up is not None
        out, self.restored = self.engine.finish(self.looked_up)
        return out

    def restored_tokens(self) -> int:
        return self.restored

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        return self.engine.keys(tokens)

    def close(self) -> None:
        self.engine.close()


class VllmCase(HookCase):
    name = "vllm"
    block_tokens = BLOCK_SIZE
    splits_lookup = True

    def __init__(self, engine: KitEngine, reference: ReferenceEngine) -> None:
        self.engine = engine
        self.references = reference

    def open(self, storage: Storage) -> Driver:
        return VllmDriver(self.engine, storage)

    def reference(self, tokens: Sequence[int]) -> Output:
        return self.references(tokens)

    def same(self, a: Any, b: Any) -> bool:
        """The same greedy tokens, and logprobs within 1e-4 (a split prefill rounds differently)."""
        return bool(a[0] == b[0]) and all(abs(x - y) <= 1e-4 for x, y in zip(a[1], b[1], strict=True))


__all__ = ["KitConnector", "KitEngine", "Relay", "VllmCase", "VllmDriver"]
