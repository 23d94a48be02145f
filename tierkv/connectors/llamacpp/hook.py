"""The llama.cpp hook: restore a prompt's stored prefix into a ``Llama`` before a call, store after.

::

    llm = Llama(model_path="model.gguf", n_ctx=8192, flash_attn=True)
    tier = LlamaTier(llm, open_cluster(load_config()))
    llm.set_cache(tier.cache())            # every create_completion / chat call: restore, then store
    # or by hand, around your own generate loop:
    tier.restore(tokens)                   # longest stored prefix into llm's sequence, if it beats memory
    for token in llm.generate(tokens): ...  # llama-cpp-python's own prefix match reuses it
    tier.store()                           # ship the blocks the vaults lack (in the background)

A prompt's KV is llama.cpp's sequence state cut into blocks of ``block_size`` tokens
(:mod:`~tierkv.connectors.llamacpp.state`), keyed by the chained hash of their tokens inside a namespace
of the model file, its metadata and RoPE setup, the KV types and layout (flash attention on or off), the
state format and the llama-cpp-python release. A restore looks the prompt's blocks up, fetches the
leading run the vaults hold (at least one prompt token is left to compute), rebuilds a state of it and
loads that — only when it is longer than what the context already holds. Anything that fails (a vault
down, a block missing or corrupt, llama.cpp refusing the state) is a miss: the tokens are recomputed.
Stores copy the state on the caller's thread and ship it on a bounded background worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from tierkv.codec import LayerGroup
from tierkv.connectors.llamacpp import engine
from tierkv.connectors.llamacpp.state import Envelope, StateLayout, blocks, parse, rebuild
from tierkv.errors import TierKVError
from tierkv.keys import Namespace, block_keys
from tierkv.retention import Retention, chain_meta
from tierkv.retention.layout import Layout
from tierkv.tiering.arrays import NumpyArrays
from tierkv.tiering.background import BoundedWorker
from tierkv.tiering.pipeline import ColdTier, StoreTally
from tierkv.tiering.spec import StreamSpec
from tierkv.tiering.storage import Storage

if TYPE_CHECKING:
    from tierkv.connectors.llamacpp.cache import TieredLlamaCache

log = logging.getLogger(__name__)

SEQ: Final = 0
"""The sequence llama-cpp-python's ``Llama`` evaluates into."""


@dataclass
class Restore:
    """One restore: ``tokens`` now in the context from the vaults (0: none); what it cost."""

    tokens: int = 0
    found: int = 0
    """Leading blocks the vaults reported holding."""
    rejected: int = 0
    fetched_bytes: int = 0
    lookup_s: float = 0.0
    get_s: float = 0.0
    load_s: float = 0.0


def common_prefix(a: Sequence[int] | npt.NDArray[Any], b: Sequence[int]) -> int:
    """Length of the common leading run of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(diff[0]) if diff.size else n


class LlamaTier:
    """Cold tier for one ``llama_cpp.Llama``: :meth:`restore` before a call, :meth:`store` after.

    ``storage`` is any :class:`~tierkv.tiering.storage.Storage` (``open_cluster(config)`` for the vaults;
    the caller closes it). ``model_id`` names the weights; left out, a fingerprint of the GGUF file is
    used, so a copy of the file elsewhere shares blocks and other weights never do. ``tenant`` keeps
    tenants' blocks apart. Start-up refuses (:class:`~tierkv.errors.UnsupportedStateError`) a
    llama-cpp-python outside the tested releases and models whose memory is not one full-attention
    cache (sliding-window, recurrent, hybrid, M-RoPE, encoder-decoder), and probes the KV layout once.
    """

    def __init__(
        self,
        llm: Any,
        storage: Storage,
        *,
        model_id: str | None = None,
        block_size: int = 16,
        tenant: str = "",
        max_inflight: int = 4,
        retention: Retention | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        engine.check_version()
        engine.check_model(llm)
        self.llm = llm
        self.block_size = block_size
        self.retention = retention or Retention()
        probe = engine.probe_layout(llm)
        self.layout: StateLayout = probe.layout
        self.n_stream = probe.n_stream
        self.arch = probe.arch
        self.namespace = Namespace(
            model=model_id or f"gguf:{engine.file_fingerprint(llm.model_path)}",
            dtype=engine.kv_types(self.layout),
            codec="raw",
            layout=self.layout.describe(),
            model_fingerprint=engine.fingerprint(llm),
            tenant=tenant,
            extra={"engine": f"llama-cpp-python {engine.version()}", "block_size": str(block_size)},
        )
        self.spec = StreamSpec(self.namespace.digest, LayerGroup.ATTENTION)
        self.tier = ColdTier(storage, NumpyArrays())
        self.worker = BoundedWorker(max_inflight, name="tierkv-llamacpp-store")
        self.stored = StoreTally()
        self.skipped = 0
        """Stores refused because the context's state could not be cut (logged)."""
        self._lock = threading.Lock()

    # ----------------------------------------------------------------------------------------- keys

    @property
    def block_bytes(self) -> int:
        return self.layout.block_bytes(self.block_size)

    def keys(self, tokens: Sequence[int] | npt.NDArray[Any], n_blocks: int) -> list[bytes]:
        """Chained keys of the first ``n_blocks`` blocks of ``tokens``."""
        ids = np.asarray(tokens[: n_blocks * self.block_size], np.int64)
        return block_keys(ids, self.block_size, namespace=self.namespace)

    def reachable(self, prompt_tokens: int) -> int:
        """Blocks a restore may give a prompt of this length: whole blocks, short of its last token, that
        fit the context."""
        limit = min(prompt_tokens - 1, int(self.llm.n_ctx()) - 1)
        return max(limit, 0) // self.block_size

    def held(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` the context already holds (llama-cpp-python's own prefix match)."""
        return common_prefix(self.llm.input_ids[: self.llm.n_tokens], tokens)

    def lookup(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` a restore could bring from the vaults now (no data moves)."""
        keys = self.keys(tokens, self.reachable(len(tokens)))
        return self.tier.lookup(self.spec, keys) * self.block_size

    # -------------------------------------------------------------------------------------- restore

    def fetch(self, tokens: Sequence[int], beyond: int = 0) -> tuple[npt.NDArray[np.uint8], Restore]:
        """The leading run of ``tokens``' blocks that arrives and verifies, one row per block, when it
        covers more than ``beyond`` tokens (else no rows)."""
        result = Restore()
        none = np.empty((0, self.block_bytes), np.uint8)
        limit = self.reachable(len(tokens))
        if limit * self.block_size <= beyond:
            return none, result
        keys = self.keys(tokens, limit)
        t = time.perf_counter()
        result.found = self.tier.lookup(self.spec, keys)
        result.lookup_s = time.perf_counter() - t
        if result.found * self.block_size <= beyond:
            return none, result
        rows = np.empty((result.found, self.block_bytes), np.uint8)
        expect = self.spec.expect((self.block_bytes,), self.block_size, "uint8")
        got = self.tier.restore(self.spec, keys[: result.found], expect, rows.__getitem__, leading_only=True)
        result.rejected, result.fetched_bytes, result.get_s = got.rejected, got.fetched_bytes, got.get_s
        if got.leading * self.block_size <= beyond:
            return none, result
        return rows[: got.leading], result

    def restore(self, tokens: Sequence[int]) -> Restore:
        """Load the longest stored prefix of ``tokens`` into the ``Llama``'s sequence, when it is longer
        than the prefix the context holds; the next ``generate`` / ``eval`` continues after it."""
        tokens = [int(t) for t in tokens]
        llm = self.llm
        have = self.held(tokens)
        run, result = self.fetch(tokens, beyond=have)
        n = len(run) * self.block_size
        if n == 0:
            return result
        t = time.perf_counter()
        data = rebuild(self.layout, run, self.block_size, Envelope(SEQ, "", self.n_stream))
        loaded = engine.load_seq_state(llm.ctx, data, SEQ)
        result.load_s = time.perf_counter() - t
        if not loaded:
            # llama.cpp empties the sequence when it refuses a state: the context holds nothing now
            llm.n_tokens = 0
            log.warning("llama.cpp refused a restored state of %d tokens: recomputing", n)
            return result
        llm.input_ids[:n] = tokens[:n]
        llm.n_tokens = n
        if hasattr(llm, "_requires_eval"):
            llm._requires_eval = True  # its logits are the old ones: never sample before an eval
        result.tokens = n
        return result

    def context_state(self, tokens: Sequence[int], beyond: int = 0) -> tuple[int, bytes, Restore]:
        """A whole-context state (``Llama.load_state``'s format) of the longest stored prefix of
        ``tokens`` longer than ``beyond`` tokens: its token count (0: none), bytes and the restore."""
        run, result = self.fetch(tokens, beyond)
        n = len(run) * self.block_size
        if n == 0:
            return 0, b"", result
        t = time.perf_counter()
        data = rebuild(self.layout, run, self.block_size, Envelope(SEQ, self.arch, self.n_stream))
        result.load_s = time.perf_counter() - t
        result.tokens = n
        return n, data, result

    # ---------------------------------------------------------------------------------------- store

    def store(self, layout: Layout | None = None) -> bool:
        """Copy the sequence's state now and ship its full blocks the vaults lack in the background
        (False: the worker is closed), tagged from the request's prompt ``layout`` (source class,
        importance) by ``retention``. :meth:`flush` waits for it."""
        llm = self.llm
        tokens = np.array(llm.input_ids[: llm.n_tokens], np.int64)
        data = engine.seq_state(llm.ctx, SEQ)
        return self.worker.submit(lambda: self._ship(tokens, data, SEQ, layout))

    def store_state(
        self, tokens: Sequence[int] | npt.NDArray[Any], state: bytes, layout: Layout | None = None
    ) -> bool:
        """Ship a whole-context state (``Llama.save_state().llama_state``) holding ``tokens``."""
        ids = np.array(tokens, np.int64)
        return self.worker.submit(lambda: self._ship(ids, state, None, layout))

    def _ship(
        self,
        tokens: npt.NDArray[np.int64],
        data: bytes | npt.NDArray[np.uint8],
        seq: int | None,
        layout: Layout | None,
    ) -> None:
        try:
            state = parse(data, seq_id=seq)
            if state.cells and state.layout != self.layout:
                raise TierKVError("the state's layout differs from the probed one")
        except TierKVError as exc:
            with self._lock:
                self.skipped += 1
            log.warning("not storing a llama.cpp state: %s", exc)
            return
        full = min(state.cells, len(tokens)) // self.block_size
        keys = self.keys(tokens, full)
        have = self.tier.lookup(self.spec, keys)
        cut = blocks(state, self.block_size, have, full)
        meta = chain_meta(keys, self.block_size, self.retention, layout=layout, tokens=tokens.tolist())
        tally = self.tier.store(
            self.spec,
            ((keys[i], b, self.block_size) for i, b in zip(range(have, full), cut, strict=True)),
            meta,
        )
        with self._lock:
            self.stored.add(tally)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for every store submitted so far; False if ``timeout`` passed first."""
        return self.worker.drain(timeout)

    def cache(self) -> TieredLlamaCache:
        """A ``llama_cpp`` cache over this tier, for ``Llama.set_cache``."""
        from tierkv.connectors.llamacpp.cache import TieredLlamaCache

        return TieredLlamaCache(self)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Ship what is queued (up to ``timeout``) and stop the worker; the storage stays the caller's."""
        done = self.worker.close(timeout)
        self.tier.close()
        return done


__all__ = ["SEQ", "LlamaTier", "Restore", "common_prefix"]
