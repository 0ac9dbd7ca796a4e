"""Tool calls in sampled text: parsed back into OpenAI `tool_calls` without losing a byte.

A model writes a call as text in its family's syntax. Each `CallSyntax` here knows one syntax
both ways: `parse` turns text into calls, and `grammar` is the llguidance grammar that forces the
model to write calls in it (`tool_choice` "required" or a named function, `policy/constraints.py`).

- `smollm2`: `<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>`, a JSON list (one
  object is accepted too), as SmolLM2 was tuned to write (`policy/tool_format.py`).
- `hermes`: one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block per call (Hermes,
  Qwen2.5); a block holding a list is read like SmolLM2's.
- `llama3_json`: Llama 3.1/3.2 JSON tool calling, `{"name": ..., "parameters": {...}}` as the
  whole answer, bare or after `<|python_tag|>`; several calls are separated by `;`.
- a tokenizer that declares a `response_template` (transformers' declarative response parsing,
  `tokenizer.parse_response`) is read with transformers' own parser first (`DeclaredSyntax`).

Every syntax takes the arguments from `arguments` or `parameters` (Llama's name), as an object or
a JSON string of one. A `<tool_call>` block is read by its JSON's structure: it ends at the first
`</tool_call>` after its JSON value, so a string argument may hold either tag (`tagged_block_end`).
A call cut short at `max_tokens` is read by `parse_cut`: the whole calls of its block as usual,
and the cut one, once its name is whole, with its arguments as far as they were written (a string
that is not yet JSON, as OpenAI returns a call cut at `max_tokens`); a cut call whose name is not
whole is left out. Either way no call markup reaches `content`. Nothing is
dropped silently: a call-like block that does not parse (invalid
JSON, an undeclared tool name, arguments that are not an object, both keys with different values,
unknown keys) stays in `content` as the model wrote it and is listed in `ParsedOutput.unparsed`
with the reason, which the policy counts and logs. A name outside the request's tools is not a
call: the agent and the reward see the text.

Libraries looked at for this: transformers' response templates are used where a tokenizer
declares one; vLLM's tool parsers (hermes, llama3_json, ...) do this for vLLM's server but come
only with vLLM and its CUDA torch; `partial-json-parser` parses incomplete JSON, which streaming
needs, not this. The three syntaxes above are `json.JSONDecoder.raw_decode` and `json.loads`
plus a little scanning.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
_LOOKS_LIKE_JSON_CALL = re.compile(r'^\s*(?:<\|python_tag\|>\s*)?\{\s*"name"\s*:')
_CALL_KEYS = {"name", "arguments", "parameters", "id", "type"}


@dataclass
class UnparsedCall:
    """A call-like block kept as text, and why it was not read as a call."""

    text: str
    reason: str


@dataclass
class ParsedOutput:
    content: str | None
    tool_calls: list[dict[str, Any]]
    unparsed: list[UnparsedCall] = field(default_factory=list)
    """Call-like blocks that stayed in `content` (counted in `ToolCallCounters`, logged by the policy)."""
    cut: CutCall | None = None
    """A call block cut at max_tokens (`parse_cut`), read into `tool_calls` instead of kept as text."""


@dataclass
class CutCall:
    """A call block that a text cut at max_tokens ends inside."""

    text: str
    """The block as written."""
    last: str
    """"partial": the last of `tool_calls` is the cut call, its arguments as far as written;
    "nameless": the cut came before the call's name was whole, and it is left out;
    "whole": the cut came after the block's calls were whole (in its closing tag)."""

    def describe(self) -> str:
        return {
            "partial": "returned with its arguments as far as written",
            "nameless": "left out: its name was not whole",
            "whole": "its calls were whole",
        }[self.last]


def declared_names(tools: list[dict[str, Any]] | None) -> set[str]:
    return {t.get("function", t).get("name") for t in tools or []}


def new_call(name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI tool call with a fresh id; `arguments` as the JSON string OpenAI sends."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def call_from(item: Any, names: set[str]) -> tuple[dict[str, Any] | None, str]:
    """(an OpenAI tool call, "") from one parsed call object, or (None, why not)."""
    if not isinstance(item, dict):
        return None, f"a call must be a JSON object, got {type(item).__name__}"
    if "function" in item and isinstance(item["function"], dict) and "name" not in item:
        item = item["function"]  # OpenAI's own shape, {"type": "function", "function": {...}}
    name = item.get("name")
    if not isinstance(name, str):
        return None, "the call has no string 'name'"
    if name not in names:
        return (
            None,
            f"{name!r} is not one of the request's tools ({', '.join(sorted(map(str, names))) or 'none'})",
        )
    unknown = set(item) - _CALL_KEYS
    if unknown:
        return (
            None,
            f"unknown keys {sorted(unknown)} next to 'name' (arguments go in 'arguments' or 'parameters')",
        )
    if "arguments" in item and "parameters" in item and item["arguments"] != item["parameters"]:
        return None, "both 'arguments' and 'parameters', with different values"
    args = item.get("arguments", item.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return None, f"arguments are a string that is not JSON ({exc.msg})"
        except RecursionError:
            return None, "arguments are a string nested too deeply to read"
    if not isinstance(args, dict):
        return None, f"arguments must be a JSON object, got {type(args).__name__}"
    return new_call(name, args), ""


def _read_payload(payload: str, names: set[str]) -> tuple[list[dict[str, Any]] | None, str]:
    """All calls of one block (an object or a list of them), or (None, why not): a block is read whole or not at all."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at character {exc.pos})"
    except RecursionError:
        return None, "nested too deeply to read"
    items = data if isinstance(data, list) else [data]
    if not items:
        return None, "an empty list of calls"
    calls = []
    for item in items:
        call, reason = call_from(item, names)
        if call is None:
            return None, reason
        calls.append(call)
    return calls, ""


def _content(pieces: list[str]) -> str | None:
    return "".join(pieces).strip() or None


class CallSyntax(Protocol):
    name: str

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput: ...

    def parse_cut(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput:
        """As `parse`, for a text cut at max_tokens: a call it ends inside is read as far as written."""
        ...

    def grammar(self, call_schema: dict[str, Any], *, multiple: bool, key: str) -> str:
        """llguidance Lark rules whose top rule `tool_calls` is calls (one, or one or more) whose JSON
        matches `call_schema`; `key` is the syntax's name for the arguments ("arguments" or "parameters")."""
        ...

    def text_lexeme(self) -> str:
        """An llguidance lexeme (the right side of `TEXT: ...`): non-empty text that holds no call in this syntax."""
        ...


def parse_tagged(text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput:
    """`<tool_call>...</tool_call>` blocks (an object or a list each); the rest, and blocks that do not parse, is content."""
    if not tools or OPEN_TAG not in text:
        return ParsedOutput(content=text, tool_calls=[])
    names = declared_names(tools)
    calls: list[dict[str, Any]] = []
    unparsed: list[UnparsedCall] = []
    kept: list[str] = []
    last = 0
    for start, inner, end in _tagged_blocks(text):
        found, reason = _read_payload(text[start + len(OPEN_TAG) : inner].strip(), names)
        if found is None:
            unparsed.append(UnparsedCall(text[start:end], reason))
            continue
        kept.append(text[last:start])
        last = end
        calls.extend(found)
    kept.append(text[last:])
    return ParsedOutput(content=_content(kept), tool_calls=calls, unparsed=unparsed)


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _skip(text: str, i: int) -> int:
    space = _SPACE.match(text, i)
    assert space is not None  # \s* matches at every position
    return space.end()


def tagged_block_end(
    text: str, start: int, *, final: bool = True, cut: bool = False
) -> tuple[int, int] | None:
    """Where the `<tool_call>` block opening at `start` ends: (the end of its payload, the end of the
    block: past its closing tag, or the end of the text when it has none); None when more text could
    still change it (`final` False: the text is still growing).

    The block is read by its JSON's structure: its closing tag is the first `</tool_call>` after
    the JSON value (`json.JSONDecoder.raw_decode`), so a string argument may hold either tag. A
    payload that is no JSON value ends at the first closing tag after the opening one, as the
    model wrote it; one followed by other text than its closing tag, at the first after the value.
    With `cut` (the text ended at max_tokens), a payload that may still become a JSON value (no
    closing tag outside its strings) runs to the end of the text: the call being written.
    """
    body = start + len(OPEN_TAG)
    i = _skip(text, body)
    try:
        _, after = _DECODER.raw_decode(text, i)
    except (json.JSONDecodeError, RecursionError):  # no JSON value (yet): the first closing tag ends it
        # while no closing tag stands outside its strings, the value may still be being written
        if not _closed_outside_strings(text, i):
            if not final:
                return None
            if cut:
                return len(text), len(text)
        after = body
    else:
        k = _skip(text, after)
        if text.startswith(CLOSE_TAG, k):
            return k, k + len(CLOSE_TAG)
        if CLOSE_TAG.startswith(text[k:]):  # the text ends after the value, or inside its closing tag
            return (len(text), len(text)) if final else None
    close = text.find(CLOSE_TAG, after)
    if close >= 0:
        return close, close + len(CLOSE_TAG)
    return (len(text), len(text)) if final else None


def _closed_outside_strings(text: str, i: int) -> bool:
    """Whether a `</tool_call>` follows `i` outside the JSON strings that open after it. Then no text
    appended can make a JSON value of what starts at `i`, if it is none now: `<` is JSON only in a string."""
    return any(ch == "<" and text.startswith(CLOSE_TAG, k) for k, ch in _outside_strings(text, i))


def _outside_strings(text: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """(index, character) of each character of `text` from `start` that lies outside JSON strings
    (their quotes included in the strings)."""
    in_string = escaped = False
    for k in range(start, len(text)):
        ch = text[k]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        else:
            yield k, ch


def _tagged_blocks(text: str, *, cut: bool = False) -> Iterator[tuple[int, int, int]]:
    """(start, end of payload, end) of each `<tool_call>` block of a whole text, in order (`tagged_block_end`)."""
    pos = 0
    while (start := text.find(OPEN_TAG, pos)) >= 0:
        found = tagged_block_end(text, start, cut=cut)
        assert found is not None  # a whole text settles every block
        yield start, *found
        pos = found[1]


def _cut_fields(text: str, i: int) -> tuple[dict[str, Any], str | None, str]:
    """The keys of a JSON object that `text` ends inside, from its `{` at `i`: (the fields written
    whole, the key whose value was being written when it ended (None: between fields), that value's
    text so far)."""
    fields: dict[str, Any] = {}
    i = _skip(text, i + 1)
    while i < len(text):
        try:
            key, j = _DECODER.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError):  # cut short, or nested past the parser
            return fields, None, ""  # ended inside a key
        j = _skip(text, j)
        if j >= len(text) or text[j] != ":":
            return fields, None, ""
        j = _skip(text, j + 1)
        try:
            value, k = _DECODER.raw_decode(text, j)
        except (json.JSONDecodeError, RecursionError):  # cut short, or nested past the parser
            return fields, str(key), text[j:]
        fields[str(key)] = value
        k = _skip(text, k)
        i = _skip(text, k + 1) if k < len(text) and text[k] == "," else k
    return fields, None, ""


def _cut_call(text: str, i: int, names: set[str]) -> tuple[dict[str, Any] | None, str]:
    """The call `text` ends inside (from its `{` at `i`): (a call with its arguments as far as
    written, ""), (None, "") when its name is not whole yet, or (None, why not) when it is no call."""
    fields, key, written = _cut_fields(text, i)
    unknown = (set(fields) | ({key} if key is not None else set())) - _CALL_KEYS
    if unknown:
        return None, f"unknown keys {sorted(unknown)} next to 'name'"
    name = fields.get("name")
    if name is None:
        return None, ""  # the name is not whole yet: nothing to report as a call
    if not isinstance(name, str) or name not in names:
        return (
            None,
            f"{name!r} is not one of the request's tools ({', '.join(sorted(map(str, names))) or 'none'})",
        )
    if "arguments" in fields or "parameters" in fields:  # written whole; the cut came after them
        return call_from(fields, names)
    return new_call(name, written if key in ("arguments", "parameters") else ""), ""


def read_cut_calls(text: str, start: int, names: set[str]) -> tuple[list[dict[str, Any]] | None, str]:
    """The calls of a JSON call payload (an object, or a list of them) that `text` ends inside, from
    `start`, and how the last one was cut (`CutCall.last`): the whole ones, then the cut one once
    its name is whole; (None, why not) when the payload is no call being written."""
    i = _skip(text, start)
    if i >= len(text):
        return [], "nameless"
    many = text[i] == "["
    if many:
        i = _skip(text, i + 1)
    elif text[i] != "{":
        return None, "not a JSON call"
    calls: list[dict[str, Any]] = []
    while i < len(text):
        if many and text[i] == "]":
            return calls, "whole"  # the list is whole: the cut came in what follows it
        if text[i] != "{":
            return None, "a call must be a JSON object"
        try:
            item, end = _DECODER.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError):  # cut short, or nested past the parser
            call, reason = _cut_call(text, i, names)
            if reason:
                return None, reason
            return (calls, "nameless") if call is None else ([*calls, call], "partial")
        call, reason = call_from(item, names)
        if call is None:
            return None, reason
        calls.append(call)
        i = _skip(text, end)
        if not many:
            return calls, "whole"
        if i < len(text) and text[i] == ",":
            i = _skip(text, i + 1)
    return calls, "nameless" if many else "whole"


def parse_tagged_cut(text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput:
    """`parse_tagged` for a text cut at max_tokens: an unclosed last `<tool_call>` block (or a part of
    the tag itself at the very end) is read as calls being written (`read_cut_calls`), not kept as text."""
    if not tools:
        return parse_tagged(text, tools)
    blocks = list(_tagged_blocks(text, cut=True))
    found: list[dict[str, Any]] | None
    if blocks and blocks[-1][1] == blocks[-1][2] == len(text):  # the last block has no closing tag
        start = blocks[-1][0]
        found, last = read_cut_calls(text, start + len(OPEN_TAG), declared_names(tools))
    else:
        # the text ends inside the tag, or outside any block
        start = _safe_end(text, blocks[-1][2] if blocks else 0, OPEN_TAG)
        found, last = ([], "nameless") if start < len(text) else (None, "")
    if found is None:  # no call being written: parsed as any text (a block that does not parse stays text)
        return parse_tagged(text, tools)
    head = parse_tagged(text[:start], tools)
    content = (head.content or "").strip() or None
    return ParsedOutput(content, head.tool_calls + found, head.unparsed, cut=CutCall(text[start:], last))


def _json_block(call_schema: dict[str, Any]) -> str:
    return "%json " + json.dumps(call_schema)


TAGGED_TEXT = r"/(?s:.+)/ & ~/(?s:.*)<tool_call>(?s:.*)/"
"""Text without a `<tool_call>` tag (llguidance's `&` and `~` on lexemes)."""


class SmolLM2Syntax:
    """`<tool_call>[{...}, ...]</tool_call>`: the calls as one JSON list."""

    name = "smollm2"
    key = "arguments"

    def parse(self, text, tools):
        return parse_tagged(text, tools)

    def parse_cut(self, text, tools):
        return parse_tagged_cut(text, tools)

    def text_lexeme(self):
        return TAGGED_TEXT

    def grammar(self, call_schema, *, multiple, key="arguments"):
        top = ("x-guidance", "$defs")  # llguidance reads its options, and "#" refs resolve, at the top
        items = {k: v for k, v in call_schema.items() if k not in top}
        array = {"type": "array", "items": items, "minItems": 1} | ({} if multiple else {"maxItems": 1})
        array |= {k: call_schema[k] for k in top if k in call_schema}
        return 'tool_calls: "<tool_call>" ' + _json_block(array) + ' "</tool_call>"\n'


class HermesSyntax:
    """`<tool_call>\\n{...}\\n</tool_call>` per call, blocks separated by a newline."""

    name = "hermes"
    key = "arguments"

    def parse(self, text, tools):
        return parse_tagged(text, tools)

    def parse_cut(self, text, tools):
        return parse_tagged_cut(text, tools)

    def text_lexeme(self):
        return TAGGED_TEXT

    def grammar(self, call_schema, *, multiple, key="arguments"):
        block = 'tool_call_block: "<tool_call>\\n" ' + _json_block(call_schema) + ' "\\n</tool_call>"\n'
        top = (
            'tool_calls: tool_call_block ("\\n" tool_call_block)*\n'
            if multiple
            else "tool_calls: tool_call_block\n"
        )
        return top + block


class Llama3JsonSyntax:
    """Llama 3.1 JSON tool calling: the whole answer is `{"name": ..., "parameters": {...}}` (after an
    optional `<|python_tag|>`), several calls separated by `;`."""

    name = "llama3_json"
    key = "parameters"

    def parse(self, text, tools):
        if not tools or not _LOOKS_LIKE_JSON_CALL.match(text):
            return ParsedOutput(content=text, tool_calls=[])
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :]
        names = declared_names(tools)
        calls, reason = _read_payload(body, names)
        if calls is None and ";" in body:  # several calls: `{...}; {...}`
            calls, reason = _read_calls(_split_top_level(body, ";"), names)
        if calls is None:
            return ParsedOutput(content=text, tool_calls=[], unparsed=[UnparsedCall(text, reason)])
        return ParsedOutput(content=None, tool_calls=calls)

    def parse_cut(self, text, tools):
        parsed = self.parse(text, tools)
        if not tools or not parsed.unparsed or not _could_be_json_call(text):
            return parsed
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :]
        names = declared_names(tools)
        *whole, last = _split_top_level(body, ";") or [""]
        calls, _ = _read_calls(whole, names)
        cut, how = read_cut_calls(last, 0, names) if calls is not None else (None, "")
        if calls is None or cut is None:
            return parsed
        return ParsedOutput(content=None, tool_calls=calls + cut, cut=CutCall(text, how))

    def grammar(self, call_schema, *, multiple, key="parameters"):
        top = 'tool_calls: tool_call ("; " tool_call)*\n' if multiple else "tool_calls: tool_call\n"
        return top + "tool_call: " + _json_block(call_schema) + "\n"

    def text_lexeme(self):
        # an answer that opens like a JSON call (`{`, `<|python_tag|>`) is read as one
        return r"/(?s:.+)/ & ~/\s*(\{|<\|python_tag\|>)(?s:.*)/"


def _read_calls(parts: list[str], names: set[str]) -> tuple[list[dict[str, Any]] | None, str]:
    calls: list[dict[str, Any]] = []
    for part in parts:
        found, reason = _read_payload(part, names)
        if found is None:
            return None, reason
        calls.extend(found)
    return calls, ""


def _split_top_level(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside JSON strings, objects and lists."""
    parts, depth, start = [], 0, 0
    for i, ch in _outside_strings(text):
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


class DeclaredSyntax:
    """A tokenizer's declared `response_template`, read with transformers' `parse_response`.

    When transformers cannot read the text (it raises on a call that is not JSON), or returns calls
    that `call_from` refuses, the text goes to `fallback`, which keeps what does not parse as content.
    Forced calls use the fallback's grammar: a response template describes reading, not writing.
    """

    name = "declared"

    def __init__(self, tokenizer, fallback: CallSyntax):
        self.tokenizer, self.fallback = tokenizer, fallback
        self.key = getattr(fallback, "key", "arguments")

    def parse(self, text, tools):
        if not tools:
            return ParsedOutput(content=text, tool_calls=[])
        try:
            message = self.tokenizer.parse_response(text, prefix="", tools=tools)
        except (ValueError, KeyError, TypeError):
            return self.fallback.parse(text, tools)
        names = declared_names(tools)
        calls = []
        for raw in message.get("tool_calls") or []:
            call, _ = call_from(raw, names)
            if call is None:
                return self.fallback.parse(text, tools)
            calls.append(call)
        if not calls:
            return self.fallback.parse(text, tools)
        content = message.get("content")
        return ParsedOutput(
            content=(content.strip() or None) if isinstance(content, str) else None, tool_calls=calls
        )

    def parse_cut(self, text, tools):
        return self.fallback.parse_cut(text, tools)  # a response template reads whole answers only

    def grammar(self, call_schema, *, multiple, key="arguments"):
        return self.fallback.grammar(call_schema, multiple=multiple, key=key)

    def text_lexeme(self):
        return self.fallback.text_lexeme()


SYNTAXES: dict[str, type] = {
    "smollm2": SmolLM2Syntax,
    "hermes": HermesSyntax,
    "llama3_json": Llama3JsonSyntax,
}


def syntax_for_template(chat_template: str | None) -> CallSyntax:
    """The call syntax a chat template that renders tools itself teaches its model.

    Llama 3.1/3.2 templates write earlier calls as `{"name": ..., "parameters": ...}` and mention
    `<|python_tag|>`; Hermes and Qwen templates write `<tool_call>` blocks (the default).
    """
    template = chat_template or ""
    if "<tool_call>" not in template and (PYTHON_TAG in template or '"parameters": ' in template):
        return Llama3JsonSyntax()
    return HermesSyntax()


@dataclass
class ToolCallCounters:
    """Tool calls read from sampled text, and call-like blocks kept as text (a metric for the server)."""

    parsed: int = 0
    unparsed: int = 0
    cut: int = 0
    """Calls cut at max_tokens (returned with their arguments as far as written, or left out)."""


class CallStream:
    """Reads a completion's text as it grows: content to send now, and calls once they are whole.

    Streaming cannot send a call's pieces before it knows the call parses: a block that turns out
    not to be a call must reach the client as content, not as half a call. So text that may start
    a call (a `<tool_call>` tag or a prefix of one; for `llama3_json`, an answer that opens with `{`
    or `<|python_tag|>`) is held back until its block closes, then goes out either as calls (each
    with its id, name and whole arguments) or as content. Everything else goes out at once; with a
    declared response template all text is held to the end. At
    `finish`, the content sent, joined and stripped, equals `syntax.parse(text).content` and the
    calls equal its `tool_calls` (ids aside); with `cut` (the text ended at max_tokens), those of
    `syntax.parse_cut(text)`.
    """

    def __init__(self, syntax: CallSyntax, tools: list[dict[str, Any]] | None):
        self.syntax, self.tools = syntax, tools
        self.text = ""
        self._sent = 0
        """Characters of `text` already handed out (as content or inside a call)."""
        self._mode = {"smollm2": "tagged", "hermes": "tagged", "llama3_json": "whole"}.get(
            syntax.name, "held"
        )
        """tagged: `<tool_call>` blocks; whole: a JSON call is the whole answer; held: a declared
        response template, whose syntax only transformers knows, so the text is read at the end."""

    def feed(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        """(content to send now, calls completed by this delta)."""
        self.text += delta
        if not self.tools:
            return self._release(len(self.text)), []
        if self._mode == "held":
            return "", []
        if self._mode == "whole":
            if self.text.strip() and not _could_be_json_call(self.text):
                return self._release(len(self.text)), []
            return "", []  # a JSON call is the whole answer: read at the end
        return self._tagged(final=False)

    def finish(self, *, cut: bool = False) -> tuple[str, list[dict[str, Any]], ParsedOutput]:
        """(content still held, calls still held, the parse of the whole text); `cut`: the text
        ended at max_tokens, so a call it ends inside is read as far as written (`parse_cut`)."""
        parsed = (self.syntax.parse_cut if cut else self.syntax.parse)(self.text, self.tools)
        if not self.tools:
            return self._release(len(self.text)), [], parsed
        if self._mode != "tagged":
            if self._sent == 0 and (parsed.tool_calls or parsed.cut):
                self._sent = len(self.text)
                return parsed.content or "", parsed.tool_calls, parsed
            return self._release(len(self.text)), [], parsed
        content, calls = self._tagged(final=True, cut=cut)
        return content, calls, parsed

    def _release(self, upto: int) -> str:
        out = self.text[self._sent : upto]
        self._sent = max(self._sent, upto)
        return out

    def _tagged(self, *, final: bool, cut: bool = False) -> tuple[str, list[dict[str, Any]]]:
        content = ""
        calls: list[dict[str, Any]] = []
        while True:
            start = self.text.find(OPEN_TAG, self._sent)
            if start < 0:
                held = len(self.text) if final and not cut else _safe_end(self.text, self._sent, OPEN_TAG)
                content += self._release(held)
                if cut:  # a tag cut at max_tokens is no text: left out, as `parse_cut` leaves it out
                    self._sent = len(self.text)
                return content, calls
            content += self._release(start)
            ends = tagged_block_end(self.text, start, final=final, cut=cut)
            if ends is None:
                return content, calls
            read = None
            if cut and ends[0] == ends[1]:  # the block the cut came in
                read = parse_tagged_cut(self.text[start:], self.tools)
                if read.cut is None:  # no call being written: the rest reads as a whole text, as there
                    cut, read = False, None
                    ends = tagged_block_end(self.text, start)
            assert ends is not None  # a final text settles every block
            stop = ends[1]
            block = self.text[start:stop]
            if read is None:
                read = parse_tagged(block, self.tools)
            self._sent = stop
            if read.tool_calls or read.cut:
                calls.extend(read.tool_calls)
            else:
                content += block


def _safe_end(text: str, start: int, tag: str) -> int:
    """Where text can go out without cutting a possible `tag` at its end: hold any suffix that is a prefix of it."""
    for k in range(min(len(tag) - 1, len(text) - start), 0, -1):
        if tag.startswith(text[len(text) - k :]):
            return len(text) - k
    return len(text)


def _could_be_json_call(text: str) -> bool:
    """Whether `text` (a whole answer so far) may still become a Llama JSON call."""
    body = text.lstrip()
    if PYTHON_TAG.startswith(body) or body.startswith(PYTHON_TAG):
        return True
    return body.startswith("{")
