"""``tierkv warm``: replay snapshotted prefixes into an engine through its OpenAI API.

Each prefix becomes one ``/v1/completions`` request with ``prompt`` = its token ids and ``max_tokens`` 1:
the engine's connector finds the prefix in the vaults, restores it into the GPU cache, and the engine
computes one token — so the first real request that shares the prefix hits the engine's own prefix cache.
Requests go one at a time, hottest first (a warm start must not become the load spike it avoids). A
failed request (wrong model for the ids, engine busy) is reported and the next one tried. Only the
standard library is used (urllib).
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from tierkv.warm.snapshot import Prefix

DEFAULT_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Replayed:
    """One prefix's replay: its size, the request's wall time, and the error (empty: it went through)."""

    prefix: Prefix
    seconds: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def _request(url: str, body: dict[str, Any] | None, timeout: float) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as reply:
        return json.loads(reply.read())


def engine_model(engine_api: str, timeout: float = 10.0) -> str:
    """The first model the engine serves (``GET /v1/models``); ValueError when it names none."""
    listing = _request(f"{engine_api.rstrip('/')}/v1/models", None, timeout)
    models = listing.get("data") if isinstance(listing, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise ValueError(f"{engine_api}/v1/models names no model")
    return str(models[0]["id"])


def replay(
    prefixes: Sequence[Prefix],
    engine_api: str,
    *,
    model: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[Replayed], None] | None = None,
) -> list[Replayed]:
    """Send each prefix as a one-token completion, in order; one :class:`Replayed` per prefix."""
    url = f"{engine_api.rstrip('/')}/v1/completions"
    done: list[Replayed] = []
    for p in prefixes:
        body = {"model": model, "prompt": list(p.tokens), "max_tokens": 1, "temperature": 0.0}
        start = time.perf_counter()
        error = ""
        try:
            _request(url, body, timeout)
        except urllib.error.HTTPError as exc:
            error = f"HTTP {exc.code}: {exc.read()[:200].decode(errors='replace')}"
        except (OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        result = Replayed(p, time.perf_counter() - start, error)
        done.append(result)
        if progress is not None:
            progress(result)
    return done


__all__ = ["DEFAULT_TIMEOUT_S", "Replayed", "engine_model", "replay"]
