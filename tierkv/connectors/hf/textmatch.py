"""Character-level prefix reuse for sessions that resend the whole conversation as text.

BPE is not compositional across a concatenation: ``tokenize(a + b)`` need not start with
``tokenize(a)``, because a merge can straddle the seam. A chat client that sends the whole history
each turn therefore often shares only a short *token* prefix with the previous turn even though the
*text* is a strict extension. So the stored prefix keeps its text and per-token character spans; a
new prompt is compared by characters, the stored tokens that lie entirely inside the matching text
are reused verbatim, and only the text after them is tokenized:

- ``EXACT``   the texts are identical: reuse every stored token;
- ``EXTEND``  the stored text is a prefix of the new one: reuse it, tokenize only the new text;
- ``DIVERGE`` they differ part-way: if at least ``min_fraction`` of the stored text matches, trim to
  the last token boundary inside the match and tokenize the rest; otherwise start over.

Nothing here depends on transformers: the caller supplies an ``Encoder`` that turns text into token ids
with character spans. It lives with the transformers hook, the one hook that takes whole texts.
"""

from __future__ import annotations

import bisect
import enum
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tierkv.tiering.checks import SessionSettings

logger = logging.getLogger(__name__)

DEFAULT_MIN_FRACTION = SessionSettings().min_text_fraction
"""``TieredSession``'s default ``min_text_fraction``, written once in its settings schema."""


class MatchKind(enum.Enum):
    """How a new prompt relates to the stored text it was compared with."""

    EXACT = "exact"
    EXTEND = "extend"
    DIVERGE = "diverge"
    NONE = "none"


@dataclass(frozen=True)
class TokenizedText:
    """Text with its token ids and, per token, the ``[start, end)`` character span it covers.

    Spans may be coarser than one token: a run of tokens given one shared span (e.g. generated text
    whose exact alignment is unknown) is reused all-or-nothing.
    """

    text: str
    ids: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]

    def __post_init__(self) -> None:
        if not len(self.ids) == len(self.starts) == len(self.ends):
            raise ValueError("ids, starts and ends must have the same length")

    def __len__(self) -> int:
        return len(self.ids)

    def tokens_within(self, chars: int) -> int:
        """Largest ``k`` such that tokens ``[0, k)`` lie inside the first ``chars`` characters.

        A cut is only allowed where the next token starts at or after the previous one's end, so a
        character split over two byte-level tokens is never cut in half.
        """
        k = bisect.bisect_right(self.ends, chars)
        while k > 0:
            end = self.ends[k - 1]
            if end <= chars and (k == len(self.ids) or self.starts[k] >= end):
                return k
            k -= 1
        return 0

    def cut_chars(self, k: int) -> int:
        """Character offset where text after the first ``k`` tokens starts."""
        return self.ends[k - 1] if k > 0 else 0

    def head(self, k: int) -> TokenizedText:
        """The first ``k`` tokens and the text they cover."""
        cut = self.cut_chars(k)
        return TokenizedText(self.text[:cut], self.ids[:k], self.starts[:k], self.ends[:k])

    def concat(self, other: TokenizedText) -> TokenizedText:
        """``self`` followed by ``other`` (whose spans are relative to its own text)."""
        shift = len(self.text)
        return TokenizedText(
            self.text + other.text,
            self.ids + other.ids,
            self.starts + tuple(s + shift for s in other.starts),
            self.ends + tuple(e + shift for e in other.ends),
        )

    @classmethod
    def atomic(cls, text: str, ids: Sequence[int]) -> TokenizedText:
        """Tokens whose individual spans are unknown: they share the whole text as one span."""
        n = len(ids)
        return cls(text, tuple(int(i) for i in ids), (0,) * n, (len(text),) * n)


Encoder = Callable[[str], TokenizedText]


def common_prefix_chars(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (binary search over C-level compares)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class TextMatch:
    """Result of comparing a new text with one stored text."""

    kind: MatchKind
    matched_chars: int
    stored_chars: int

    @property
    def fraction(self) -> float:
        return self.matched_chars / self.stored_chars if self.stored_chars else 0.0


def match_text(stored: str, new: str, min_fraction: float = DEFAULT_MIN_FRACTION) -> TextMatch:
    """Classify ``new`` against ``stored`` (see the module docstring)."""
    m = common_prefix_chars(stored, new)
    if m == len(stored) == len(new):
        kind = MatchKind.EXACT
    elif m == len(stored) and m > 0:
        kind = MatchKind.EXTEND
    elif m > 0 and m >= min_fraction * len(stored):
        kind = MatchKind.DIVERGE
    else:
        kind = MatchKind.NONE
    return TextMatch(kind, m, len(stored))


@dataclass(frozen=True)
class TextPlan:
    """The token ids to run for a new text, and how many of them were reused from a stored text."""

    match: TextMatch
    tokenized: TokenizedText
    reused_tokens: int

    @property
    def kind(self) -> MatchKind:
        return self.match.kind


def plan_text(
    stored: TokenizedText | None,
    new_text: str,
    encode: Encoder,
    min_fraction: float = DEFAULT_MIN_FRACTION,
) -> TextPlan:
    """Token ids for ``new_text`` reusing as much of ``stored`` as the character match allows."""
    if stored is None:
        return TextPlan(TextMatch(MatchKind.NONE, 0, 0), encode(new_text), 0)
    match = match_text(stored.text, new_text, min_fraction)
    k = stored.tokens_within(match.matched_chars) if match.kind is not MatchKind.NONE else 0
    if k == 0:
        return TextPlan(
            TextMatch(MatchKind.NONE, match.matched_chars, match.stored_chars), encode(new_text), 0
        )
    cut = stored.cut_chars(k)
    rest = new_text[cut:]
    tail = encode(rest) if rest else TokenizedText("", (), (), ())
    return TextPlan(match, stored.head(k).concat(tail), k)


class TextIndex:
    """A small LRU of recently served texts with their tokenization (no KV: that lives in the tiers).

    Bounded by entry count and by total characters. A text that a newer one extends is kept: a later
    prompt that diverges from the newer text early may still extend the older one.
    """

    def __init__(self, max_entries: int = 64, max_chars: int = 16 << 20) -> None:
        self._max_entries = max_entries
        self._max_chars = max_chars
        self._items: OrderedDict[str, TokenizedText] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def add(self, item: TokenizedText) -> None:
        with self._lock:
            previous = self._items.pop(item.text, None)
            if previous is not None:
                self._chars -= len(previous.text)
            self._items[item.text] = item
            self._chars += len(item.text)
            while self._items and (len(self._items) > self._max_entries or self._chars > self._max_chars):
                text, _ = self._items.popitem(last=False)
                self._chars -= len(text)

    def best(self, new_text: str, min_fraction: float = DEFAULT_MIN_FRACTION) -> TokenizedText | None:
        """The stored text whose match lets the most characters be reused.

        Ties go to an EXACT or EXTEND match over a DIVERGE one (nothing stored is cut), then to the
        most recent text.
        """
        best: TokenizedText | None = None
        best_score = (0, False)
        with self._lock:
            for item in reversed(self._items.values()):
                match = match_text(item.text, new_text, min_fraction)
                score = (match.matched_chars, match.kind is not MatchKind.DIVERGE)
                if match.kind is not MatchKind.NONE and score > best_score:
                    best, best_score = item, score
            if best is not None:
                self._items.move_to_end(best.text)
        return best


def plan_from_index(
    index: TextIndex, new_text: str, encode: Encoder, min_fraction: float = DEFAULT_MIN_FRACTION
) -> TextPlan:
    """``plan_text`` against the best stored text in ``index``."""
    return plan_text(index.best(new_text, min_fraction), new_text, encode, min_fraction)


__all__ = [
    "DEFAULT_MIN_FRACTION",
    "Encoder",
    "MatchKind",
    "TextIndex",
    "TextMatch",
    "TextPlan",
    "TokenizedText",
    "common_prefix_chars",
    "match_text",
    "plan_from_index",
    "plan_text",
]
