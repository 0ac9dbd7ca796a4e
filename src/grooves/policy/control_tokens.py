"""Control-token text in messages stays text: only the chat template writes control tokens.

A chat template pastes message content into one string, and encoding that string turns every
`<|im_end|>` in it into the end-of-turn token, wherever it came from. A user (or a tool result,
or a tool description) that writes `<|im_end|>\\n<|im_start|>system\\n...` would then open a
system turn of its own. `ControlTextGuard` prevents that:

1. `mark` wraps each control-token string in the request's strings between two markers, before
   the template runs. The markers are ASCII letters and digits with a random part drawn per
   guard, so a template's `tojson` or `trim` keeps them and no input can forge them.
2. `encode` splits the rendered text at the markers: text outside them is encoded as usual (so
   the template's own control tokens become tokens), each marked string is encoded as plain
   text (`split_special_tokens`). Text without marks encodes exactly as before.

Control tokens are the tokenizer's special tokens plus the added tokens the chat template
writes itself (such as Qwen's `<tool_call>`), the set `transformers` uses for its own
`sanitize_control_tokens`. That option needs `tokenize=True`; the policy renders text first, to
splice earlier turns' sampled ids in (see `TransformersPolicy.render`), so it marks and encodes
here. Plain-text encoding uses a copy of the tokenizer that always splits special tokens:
switching one shared tokenizer back and forth would race between threads that render at once.
"""

from __future__ import annotations

import copy
import re
import secrets
from typing import Any


def control_tokens(tokenizer) -> tuple[str, ...]:
    """The special added tokens, and the other added tokens the chat template contains, longest first."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    tokens = {
        t.content
        for t in tokenizer.added_tokens_decoder.values()
        if t.special or (t.content in template and not t.content.isspace())
    }
    return tuple(sorted(tokens, key=len, reverse=True))


class ControlTextGuard:
    """Marks control-token text in template inputs and encodes rendered text with it kept as text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._as_text = copy.deepcopy(tokenizer)
        self._as_text.split_special_tokens = True  # this copy never matches special tokens in text
        self._as_text(
            "", add_special_tokens=False
        )  # its first call sets the backend's flag: done here, before any thread
        tokens = control_tokens(tokenizer)
        self._control = re.compile("|".join(map(re.escape, tokens)) or "(?!)")  # (?!) matches nothing
        nonce = secrets.token_hex(8)
        self._open, self._close = f"ctl{nonce}a", f"ctl{nonce}z"
        self._marked = re.compile(
            f"{self._open}({self._control.pattern}){self._close}|{self._open}|{self._close}"
        )
        self._newline = self._encode_plain("\n")

    def mark(self, obj: Any) -> Any:
        """`obj` (a string, or lists and dicts of them) with each control-token string wrapped in markers."""
        if isinstance(obj, str):
            return self._control.sub(lambda m: self._open + m.group(0) + self._close, obj)
        if isinstance(obj, dict):
            return {k: self.mark(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.mark(v) for v in obj]
        return obj

    def find(self, text: str, token: str, start: int = 0) -> int:
        """Where the template itself wrote `token` in rendered `text`, at or after `start` (-1: nowhere);
        occurrences that came from the request (marked) are skipped."""
        at = text.find(token, start)
        while at >= 0 and text[max(at - len(self._open), 0) : at] == self._open:
            at = text.find(token, at + len(token))
        return at

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered `text`: marked strings as plain text, everything else as the tokenizer reads it."""
        # [text, marked, text, marked, ..., text]; a lone marker (a template that cut a marked string,
        # say with `split`) gives None in place of the marked string: dropped, but still a break, so
        # the text on either side cannot join into a control token
        pieces = self._marked.split(text)
        ids = self._encode_plain(pieces[0])
        for i, piece in enumerate(pieces[1:], start=1):
            if piece:
                ids += self._encode_piece(piece, as_text=i % 2 == 1)
        return ids

    def unmark(self, text: str) -> str:
        """Rendered `text` as the model reads it: the markers removed, marked strings kept."""
        return self._marked.sub(lambda m: m.group(1) or "", text)

    def _encode_plain(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _encode_piece(self, piece: str, *, as_text: bool) -> list[int]:
        """A piece from the middle of the text. It is encoded after a newline that is then dropped,
        so a SentencePiece tokenizer does not add the space it puts at the start of a string."""
        tokenizer = self._as_text if as_text else self.tokenizer
        ids = tokenizer("\n" + piece, add_special_tokens=False)["input_ids"]
        if ids[: len(self._newline)] == self._newline:
            return ids[len(self._newline) :]
        return tokenizer(piece, add_special_tokens=False)["input_ids"]
