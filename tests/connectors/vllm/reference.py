"""An engine without any connector, in a process of its own, answering prompts as a test asks for them.

The reference a tiered engine is compared with. It runs apart so that nothing of the engine under test
(its connector, its prefix cache, vLLM's process-wide state) can reach it, and it stays up so that
prompts made by a test's own checks (the conformance kit's) cost one generation each, not one engine.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from tests.connectors.vllm.engine import Output, generate, make_llm

ANSWER_TIMEOUT_S = 600.0
"""Bound on one answer, the engine's start-up included (slow on a busy 2-core machine)."""


def _serve(conn: Connection, model: str, max_tokens: int) -> None:
    llm = make_llm(Path(model))
    while (tokens := conn.recv()) is not None:
        conn.send(generate(llm, [tokens], max_tokens)[0])
    conn.close()
    # Done: skip the interpreter's teardown of vLLM and torch (seconds, and nothing left to save; the
    # engine runs in this process, with no process of its own to stop).
    os._exit(0)


class ReferenceEngine:
    """Greedy outputs of a connector-less engine, one process for its whole life (started at once, so it
    loads while the caller builds its own engine); each prompt is generated once and remembered."""

    def __init__(self, model: Path, max_tokens: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, str(model), max_tokens), daemon=True)
        self._process.start()
        child.close()
        self._answers: dict[tuple[int, ...], Output] = {}

    def __call__(self, tokens: Sequence[int]) -> Output:
        key = tuple(tokens)
        if key not in self._answers:
            self._conn.send(list(key))
            if not self._conn.poll(ANSWER_TIMEOUT_S):
                raise TimeoutError(f"the reference engine gave no answer in {ANSWER_TIMEOUT_S:.0f} s")
            self._answers[key] = self._conn.recv()
        return self._answers[key]

    def close(self) -> None:
        """Ask the process to end; kill it (by its own handle) if it does not within 30 s."""
        with contextlib.suppress(OSError):  # it is gone already
            self._conn.send(None)
        self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(10)
        self._conn.close()


__all__ = ["ReferenceEngine"]
