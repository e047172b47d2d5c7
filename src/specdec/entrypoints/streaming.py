"""Streaming output: per-request deltas and incremental detokenization.

Owns `StreamDelta` (what `SpecDecoder.stream` yields each time a step hands tokens off) and
`IncrementalDetokenizer`, which turns a growing list of token ids into text pieces without
ever cutting a multi-byte character: a byte-level BPE token can hold half of a UTF-8
sequence, and decoding it alone gives U+FFFD. The detokenizer re-decodes a short window
(from the previous emission point) and emits only text that no longer ends in U+FFFD; the
pieces joined equal `tokenizer.decode(all ids)`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StreamDelta", "IncrementalDetokenizer"]

_REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class StreamDelta:
    """New output of one request.

    index:         the prompt's position in the call (or the server's request number)
    token_ids:     the new token ids since the last delta of this request
    text:          the new text (None without a tokenizer); may be "" while a multi-byte
                   character is still incomplete
    finish_reason: None until the request's last delta, then "stop", "eos", "length",
                   "aborted" or "error"
    error:         the message when finish_reason is "error"
    stats:         the request's `GenerationStats` on its last delta (steps, acceptance,
                   seconds since the call began); None before
    """

    index: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None = None
    error: str | None = None
    stats: object | None = None


class IncrementalDetokenizer:
    """Text pieces of a growing token sequence (see the module docstring).

    Args:
        tokenizer: a transformers tokenizer, or None (then every piece is None).
        skip_special_tokens: passed to `decode` (EOS and friends leave no text).
    """

    def __init__(self, tokenizer, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # start of the window re-decoded each time
        self.read = 0  # ids up to here have been emitted as text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, token_ids: list[int], *, final: bool = False) -> str | None:
        """Add tokens; return the text they complete ("" if a character is still open).
        `final=True` flushes what is left, an incomplete character included."""
        if self.tokenizer is None:
            return None
        self.ids.extend(token_ids)
        before = self._decode(self.ids[self.prefix : self.read])
        window = self._decode(self.ids[self.prefix :])
        if not final and (len(window) <= len(before) or window.endswith(_REPLACEMENT)):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return window[len(before) :]
