"""Neutral, varied prompt text of a chosen length in tokens, for benchmarking engines over HTTP.

One sentence repeated is a poor workload: tokenizers merge repetitions, some engines detect them, and
n-gram speculative decoders feed on them. These prompts are sentences drawn from small word lists about
ordinary things (weather, rivers, libraries, timetables), different in every prompt, each prompt
opened by a unique tag so no two share a prefix. Token counts come from the engine's own tokenizer
when a counter is given (bisection over whole words), otherwise from a tokens-per-word estimate that
the caller may correct from the usage the engine reports.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

logger = logging.getLogger(__name__)

DEFAULT_TOKENS_PER_WORD = 1.35

_SUBJECTS = (
    "the librarian",
    "a ferry captain",
    "the night baker",
    "an old surveyor",
    "the orchard keeper",
    "a train conductor",
    "the museum guide",
    "a beekeeper",
    "the harbour pilot",
    "a weather observer",
    "the village potter",
    "a cartographer",
    "the lighthouse keeper",
    "a schoolteacher",
    "the river warden",
    "a botanist",
)
_VERBS = (
    "counted",
    "repaired",
    "described",
    "measured",
    "painted",
    "catalogued",
    "inspected",
    "carried",
    "sorted",
    "photographed",
    "polished",
    "mapped",
    "labelled",
    "tested",
    "arranged",
    "recorded",
)
_ADJECTIVES = (
    "narrow",
    "quiet",
    "wooden",
    "copper",
    "faded",
    "heavy",
    "bright",
    "square",
    "ancient",
    "careful",
    "distant",
    "tidy",
    "slender",
    "weathered",
    "green",
    "hollow",
)
_NOUNS = (
    "bridges",
    "timetables",
    "lanterns",
    "barometers",
    "bookshelves",
    "rowing boats",
    "seed packets",
    "clock towers",
    "stone walls",
    "tide tables",
    "field notes",
    "window frames",
    "apple crates",
    "street maps",
    "rain gauges",
    "postcards",
)
_PLACES = (
    "near the eastern pier",
    "behind the town hall",
    "along the canal path",
    "at the edge of the meadow",
    "inside the reading room",
    "under the railway arches",
    "beside the old mill",
    "on the upper terrace",
    "across the market square",
    "below the north ridge",
    "at the county archive",
    "next to the boathouse",
)
_TIMES = (
    "before sunrise",
    "on a windy afternoon",
    "during the spring fair",
    "after the first frost",
    "every second Tuesday",
    "late in the evening",
    "while the tide was out",
    "at the end of the season",
    "in the middle of the week",
    "shortly after noon",
)
_CLAUSES = (
    "and wrote the numbers in a small notebook",
    "because the records had to be complete by Friday",
    "so that visitors could find their way more easily",
    "while a light rain moved in from the coast",
    "and compared them with the figures from last year",
    "although nobody had asked for it",
    "and left a short note for the next shift",
    "until the lamps along the quay were lit",
)


class PromptMaker:
    """Makes prompts of about ``tokens`` tokens; ``count`` (text -> tokens) makes them exact."""

    def __init__(self, seed: int = 0, count: Callable[[str], int] | None = None) -> None:
        self._rng = random.Random(seed)
        self._count = count
        self.tokens_per_word = DEFAULT_TOKENS_PER_WORD
        self._serial = 0

    def sentence(self) -> str:
        r = self._rng
        words = [
            r.choice(_SUBJECTS).capitalize(),
            r.choice(_VERBS),
            f"{r.randint(2, 97)}",
            r.choice(_ADJECTIVES),
            r.choice(_NOUNS),
            r.choice(_PLACES),
            r.choice(_TIMES),
        ]
        if r.random() < 0.5:
            words.append(r.choice(_CLAUSES))
        return " ".join(words) + "."

    def _words(self, at_least: int) -> list[str]:
        words: list[str] = []
        while len(words) < at_least:
            words.extend(self.sentence().split())
        return words

    def prompt(self, tokens: int) -> str:
        """A new prompt, sharing no prefix with earlier ones, of ``tokens`` tokens (at most, when counted)."""
        self._serial += 1
        tag = f"Log-{self._serial}-{self._rng.getrandbits(40):010x}:"
        target_words = max(1, int(tokens / self.tokens_per_word))
        if self._count is None:
            return " ".join([tag, *self._words(target_words)][:target_words])
        words = [tag, *self._words(int(target_words * 1.5) + 8)]
        while self._count(" ".join(words)) < tokens:
            words.extend(self._words(len(words) // 2 + 8))
        lo, hi = 1, len(words)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._count(" ".join(words[:mid])) <= tokens:
                lo = mid
            else:
                hi = mid - 1
        text = " ".join(words[:lo])
        self.tokens_per_word = max(0.2, self._count(text) / lo)
        return text

    def observe(self, words: int, tokens: int) -> None:
        """Correct the tokens-per-word estimate from what an engine reported for a prompt."""
        if words > 0 and tokens > 0:
            self.tokens_per_word = tokens / words


__all__ = ["DEFAULT_TOKENS_PER_WORD", "PromptMaker"]
