"""The block size of a hash-id trace, given or found from its lines.

A hash-id line says how long the prompt is (``input_length``) and how many block ids cover it; with
blocks of ``b`` tokens that is ``floor(L / b)`` full blocks, plus one when a trailing partial block has an
id too (the public traces do both). So every line bounds ``b``: ``L // (n + 1) < b`` and, with two ids or
more, ``(n - 1) * b < L``. The bounds of all lines meet in an interval; the trace's block size is the
power of two in it (engines page KV in powers of two: Mooncake's traces use 512, Alibaba's Bailian traces
16, vLLM 16). Long prompts pin it down: a prompt of 6,955 tokens with 14 ids fits 464–534 tokens a block,
so 512 and no other power of two. Replaying a 16-token trace as 512-token blocks would be wrong by 32×
without a word, which is why a line that fits no block size the lines before it fit is an error naming
that line, and a size that is not pinned down is said so.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from tierkv.bench.trace.model import TraceError

MAX_BLOCK_TOKENS: Final = 1 << 16
PREFERRED: Final = (512, 16)
"""Where short prompts leave several powers of two: Mooncake's block size, then vLLM's and Bailian's."""


def _fits(length: int, ids: int) -> tuple[int, int]:
    """The block sizes ``[lo, hi]`` at which ``ids`` ids cover ``length`` tokens (full blocks, and maybe one
    partial block at the end)."""
    lo = length // (ids + 1) + 1
    hi = (length - 1) // (ids - 1) if ids >= 2 else MAX_BLOCK_TOKENS
    return lo, min(hi, MAX_BLOCK_TOKENS)


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}–{hi}"


@dataclasses.dataclass
class BlockSize:
    """Narrows the block size line by line; ``given`` pins it (``--trace-block-tokens N``)."""

    given: int | None = None
    lo: int = 1
    hi: int = MAX_BLOCK_TOKENS
    lines: int = 0

    def __post_init__(self) -> None:
        if self.given is not None:
            self.lo = self.hi = self.given

    def see(self, length: int, ids: int, where: str) -> None:
        """One line's prompt length and id count; :class:`TraceError` naming the line when it fits no
        block size the lines before it fit."""
        if ids and not length:
            raise TraceError(f"{where}.hash_ids: {ids} ids for input_length 0")
        lo, hi = _fits(length, ids)
        if lo > hi:
            raise TraceError(
                f"{where}.hash_ids: {ids} ids cannot cover input_length {length} in blocks of at most "
                f"{MAX_BLOCK_TOKENS} tokens"
            )
        if self.given is not None and not lo <= self.given <= hi:
            full, covered = length // self.given, -(-length // self.given)
            need = str(full) if full == covered else f"{full} or {covered}"
            raise TraceError(
                f"{where}.hash_ids: {ids} ids for input_length {length} in blocks of {self.given} tokens "
                f"(expected {need}; they fit blocks of {_span(lo, hi)} tokens: is the trace's block size "
                f"{self.given}? --trace-block-tokens auto finds it)"
            )
        if max(lo, self.lo) > min(hi, self.hi):
            raise TraceError(
                f"{where}.hash_ids: {ids} ids for input_length {length} fit blocks of {_span(lo, hi)} "
                f"tokens, the {self.lines:,} hash-id lines before it {_span(self.lo, self.hi)} "
                "(one trace, one block size: is this line from another trace?)"
            )
        self.lo, self.hi = max(lo, self.lo), min(hi, self.hi)
        self.lines += 1

    def powers(self) -> list[int]:
        return [1 << p for p in range(17) if self.lo <= 1 << p <= self.hi]

    def resolve(self, source: str) -> tuple[int, str | None]:
        """The block size, and a note when it was not pinned down by the lines (None when it was given or
        is the only power of two that fits)."""
        if self.given is not None:
            return self.given, None
        found = self.powers()
        if len(found) == 1:
            return found[0], None
        if not found:
            raise TraceError(
                f"{source}: its hash-id lines fit blocks of {_span(self.lo, self.hi)} tokens, no power of "
                "two: give the trace's block size with --trace-block-tokens N"
            )
        pick = next((p for p in PREFERRED if p in found), found[0])
        return pick, (
            f"block size not pinned down by the prompts (any of {', '.join(map(str, found))} tokens fit): "
            f"assumed {pick}; give --trace-block-tokens N if the trace says otherwise"
        )


__all__ = ["MAX_BLOCK_TOKENS", "BlockSize"]
