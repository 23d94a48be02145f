"""A request's prompt layout, from where vLLM puts per-request metadata, turned into block metadata.

Two ways in, read on the scheduler side (neither needs a vLLM patch):

- ``kv_transfer_params`` (``Request.kv_transfer_params``: the OpenAI request body's field of that name, or
  ``SamplingParams.extra_args["kv_transfer_params"]``)::

      {"tierkv": {"layout": [{"tokens": [0, 512], "source": "axioms", "priority": 5}, ...]}}

- vLLM's ``kv_hints`` envelope (``Request.kv_hints``, a ``vllm.v1.kv_hints.KvHintsEnvelope``:
  ``protocol_version``, ``message_id`` and ``actions``, each a ``KvHintAction`` with ``action_id``,
  ``action_type``, ``action_version`` and a JSON ``payload``). vLLM 0.32 passes it through
  ``LLMEngine.add_request(..., kv_hints=...)`` / ``AsyncLLM.generate(..., kv_hints=...)``; its OpenAI
  server has no field for it. tierkv reads the action of type :data:`HINT_ACTION`, version
  :data:`HINT_VERSION`, whose payload is ``{"layout": [...]}``.

``kv_transfer_params`` wins when both carry a layout. The chunks are token spans of the prompt (vLLM
hands the connector token ids, not text). A malformed layout never fails the request: it is ignored
(the request is stored untagged), counted as ``layouts_rejected`` and logged at most once a minute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tierkv.connectors.vllm.stats import Counters
from tierkv.retention import BlockMeta, Chunk, LayoutError, Retention, as_chunks, chain_meta

logger = logging.getLogger(__name__)

TRANSFER_KEY = "tierkv"
"""The key of tierkv's object in ``kv_transfer_params``."""
HINT_ACTION = "tierkv.layout"
HINT_VERSION = "1"
LOG_INTERVAL_S = 60.0


def raw_layout(request: Any) -> object | None:
    """The layout entries a request carries (not yet checked), or None; LayoutError if the envelope
    around them is malformed."""
    params = getattr(request, "kv_transfer_params", None)
    if isinstance(params, Mapping) and TRANSFER_KEY in params:
        ours = params[TRANSFER_KEY]
        if not isinstance(ours, Mapping) or set(ours) != {"layout"}:
            raise LayoutError(f'kv_transfer_params.{TRANSFER_KEY}: expected {{"layout": [...]}}')
        return _present(ours["layout"], f"kv_transfer_params.{TRANSFER_KEY}.layout")
    for action in getattr(getattr(request, "kv_hints", None), "actions", None) or ():
        if getattr(action, "action_type", None) != HINT_ACTION:
            continue
        version, payload = getattr(action, "action_version", None), getattr(action, "payload", None)
        if version != HINT_VERSION:
            raise LayoutError(
                f"kv_hints {HINT_ACTION}: action_version {version!r}, expected {HINT_VERSION!r}"
            )
        if not isinstance(payload, Mapping) or set(payload) != {"layout"}:
            raise LayoutError(f'kv_hints {HINT_ACTION}: payload must be {{"layout": [...]}}')
        return _present(payload["layout"], f"kv_hints {HINT_ACTION}: payload.layout")
    return None


def _present(layout: object, where: str) -> object:
    if layout is None:
        raise LayoutError(f"{where}: expected a list of chunks, got null")
    return layout


class RequestLayouts:
    """Reads layouts off requests (once each), counts and logs the bad ones, tags a request's blocks."""

    def __init__(self, counters: Counters, retention: Retention | None = None) -> None:
        self.counters = counters
        self.retention = retention or Retention()
        self._lock = threading.Lock()
        self._unlogged = 0
        self._logged_at = float("-inf")

    def chunks(self, request: Any) -> list[Chunk] | None:
        """The request's layout; None when it has none or it is malformed (counted, logged rate-limited)."""
        try:
            raw = raw_layout(request)
            if raw is None:
                return None
            chunks = as_chunks(raw)
        except (ValueError, TypeError) as exc:  # LayoutError, or whatever else a hand-built request holds
            self._reject(getattr(request, "request_id", "?"), str(exc))
            return None
        self.counters.add("layouts")
        return chunks

    def block_meta(
        self, chunks: list[Chunk] | None, request: Any, keys: Sequence[bytes], block_size: int
    ) -> dict[bytes, BlockMeta] | None:
        """Metadata of every block of the request's chain (tokens past the prompt are ``generation``),
        with each block's token ids under ``[retention] warm_tokens``; None when there is neither."""
        if not keys or (chunks is None and not self.retention.warm_tokens):
            return None
        tokens = list(request.all_token_ids) if self.retention.warm_tokens else None
        prompt = int(request.num_prompt_tokens) if chunks is not None else None
        return chain_meta(
            keys, block_size, self.retention, layout=chunks, tokens=tokens, prompt_tokens=prompt
        )

    def _reject(self, request_id: str, reason: str) -> None:
        self.counters.add("layouts_rejected")
        now = time.monotonic()
        with self._lock:
            self._unlogged += 1
            if now - self._logged_at < LOG_INTERVAL_S:
                return
            count, self._unlogged, self._logged_at = self._unlogged, 0, now
        logger.warning(
            "request %s: prompt layout ignored (%s); %d layout(s) ignored since the last such message",
            request_id,
            reason[:200],
            count,
        )


__all__ = ["HINT_ACTION", "HINT_VERSION", "TRANSFER_KEY", "RequestLayouts", "raw_layout"]
