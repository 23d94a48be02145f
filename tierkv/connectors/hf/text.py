"""Tokenizer adapters for character-level prefix reuse.

Accepts a ``tokenizers.Tokenizer`` or a transformers fast tokenizer; both report per-token character
offsets, which is what lets stored tokens be reused for the part of a new text that matches.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from tierkv.connectors.hf.textmatch import TokenizedText

logger = logging.getLogger(__name__)


def _is_raw_tokenizer(tokenizer: Any) -> bool:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return False
    return isinstance(tokenizer, Tokenizer)


def encode_with_offsets(tokenizer: Any, text: str) -> TokenizedText:
    """Token ids of ``text`` (no special tokens added) with each token's character span."""
    if _is_raw_tokenizer(tokenizer):
        enc = tokenizer.encode(text, add_special_tokens=False)
        ids, offsets = list(enc.ids), list(enc.offsets)
    else:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    return TokenizedText(
        text,
        tuple(int(i) for i in ids),
        tuple(int(s) for s, _ in offsets),
        tuple(int(e) for _, e in offsets),
    )


def decode(tokenizer: Any, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
    """Text of ``ids`` with either tokenizer kind."""
    return str(tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))


def tokenized_generation(tokenizer: Any, ids: Sequence[int]) -> TokenizedText:
    """Generated tokens with the text they decode to, per-token spans where decoding is compositional.

    Byte-level BPE usually decodes token by token to pieces that concatenate to the whole text; then
    every token gets its own span and a later prompt that edits the reply part-way can still reuse
    the tokens before the edit. When the pieces do not add up (SentencePiece space handling, a
    character split over two tokens), the reply is one all-or-nothing span.
    """
    text = decode(tokenizer, ids, skip_special_tokens=False)
    pieces = [decode(tokenizer, [i], skip_special_tokens=False) for i in ids]
    if "".join(pieces) != text:
        return TokenizedText.atomic(text, ids)
    starts, ends, pos = [], [], 0
    for piece in pieces:
        starts.append(pos)
        pos += len(piece)
        ends.append(pos)
    return TokenizedText(text, tuple(int(i) for i in ids), tuple(starts), tuple(ends))


__all__ = ["decode", "encode_with_offsets", "tokenized_generation"]
