"""A row's text as it is sampled, in pieces that never need taking back.

Streaming sends each completion's text in pieces while it is sampled. Decoding one token at a
time is wrong for byte-level tokenizers: a character can span tokens (its first bytes decode to
U+FFFD until the rest arrive). And a piece sent cannot be withdrawn, while the finished text is
cut at the first stop string, so text that may be the start of a stop string must wait. So
`TextStream` decodes the whole row each time (as `sampling._finish` does at the end), sends what
extends the text already sent, and holds back a trailing U+FFFD and the longest tail that is a
prefix of a stop string. `finish` sends the rest of the completion's final text; everything sent,
joined, equals `Completion.text`.
"""

from __future__ import annotations

from collections.abc import Iterable

REPLACEMENT = "\ufffd"


class TextStream:
    """The text deltas of one sampled row (see module docstring)."""

    def __init__(self, tokenizer, eos_token_ids: Iterable[int], stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.stop = [s for s in stop or [] if s]
        self.tokens: list[int] = []
        self.sent = ""

    def feed(self, tokens: list[int]) -> str:
        """New text to send after these tokens (may be empty)."""
        self.tokens += tokens
        body = [t for t in self.tokens if t not in self.eos_token_ids]
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        ready = len(text)
        while (
            ready > 0 and text[ready - 1] == REPLACEMENT
        ):  # an incomplete character: wait for its last bytes
            ready -= 1
        cut = _first_stop(text, self.stop)
        if cut is not None:
            ready = min(ready, cut)
        else:
            ready = min(ready, len(text) - _stop_prefix_tail(text, self.stop))
        if ready <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) : ready], text[:ready]
        return delta

    def finish(self, final_text: str) -> str:
        """The rest of the completion's final text (the sampler's own decode, cut at a stop string)."""
        if not final_text.startswith(self.sent):  # cannot happen when every piece came from `feed`
            raise ValueError(
                f"the text already sent ({self.sent!r}) is not a prefix of the completion's text"
            )
        delta, self.sent = final_text[len(self.sent) :], final_text
        return delta


def _first_stop(text: str, stop: list[str]) -> int | None:
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(cuts) if cuts else None


def _stop_prefix_tail(text: str, stop: list[str]) -> int:
    """Length of the longest tail of `text` that a stop string starts with (0: none)."""
    longest = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if s.startswith(text[len(text) - k :]):
                longest = k
                break
    return longest
