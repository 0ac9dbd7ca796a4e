"""How tools and tool calls look in a model family's prompt, and how to parse them back.

OpenAI requests carry `tools` as JSON schemas and assistant `tool_calls` as structured objects; a
small model only sees text. A `ToolFormat` turns the structured request into the messages the
model's own chat template renders, and turns sampled text back into OpenAI `tool_calls`.

SmolLM2 (the embedded default) was tuned on function calling with this convention, which
`SmolLM2ToolFormat` implements:

- the tool list goes into the system message, as JSON between `<tools>` and `</tools>`, after an
  instruction to answer with calls in the format below;
- the model calls tools with `<tool_call>[{"name": "fn", "arguments": {...}}]</tool_call>`
  (a JSON list, or a single object, which we also accept);
- tool results come back as messages with role `tool`, rendered by the chat template as any
  other role (`<|im_start|>tool ... <|im_end|>`).

Families with native tool support in their chat template (Qwen2.5, Llama 3.1) use
`TemplateToolFormat`, which passes `tools` to `apply_chat_template` and reads calls in the syntax
the template teaches: Hermes-style `<tool_call>{...}</tool_call>` blocks, Llama 3.1's JSON, or the
tokenizer's declared `response_template` (`policy/tool_calls.py`). Pick one per model with
`tool_format_for`. Each format's `syntax` both parses calls and, for forced calls, gives the
grammar that makes the model write them (`policy/constraints.py`).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from grooves.policy.tool_calls import (
    CallSyntax,
    DeclaredSyntax,
    ParsedOutput,
    SmolLM2Syntax,
    parse_tagged,
    syntax_for_template,
)

SMOLLM2_TOOL_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls to "
    "achieve the purpose. If none of the functions can be used, answer in plain text.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "To call tools, the output MUST strictly adhere to the following format, and NO other text "
    'MUST be included:\n<tool_call>[{{"name": "func_name1", "arguments": {{"argument1": "value1"}}}}]'
    "</tool_call>"
)


class ToolFormat(Protocol):
    syntax: CallSyntax
    """How calls are written in the output: parsed back, and forced by a grammar."""

    def template_messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """Messages (and tools) to hand to the chat template."""
        ...

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput: ...


def _call_text(tool_calls: list[dict[str, Any]]) -> str:
    calls = []
    for call in tool_calls:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        calls.append({"name": fn.get("name"), "arguments": args})
    return "<tool_call>" + json.dumps(calls) + "</tool_call>"


def parse_tool_calls(text: str, tools: list[dict[str, Any]] | None) -> ParsedOutput:
    """Extract `<tool_call>` blocks whose JSON names a declared tool (see `tool_calls.parse_tagged`).

    A block that is not valid JSON, or names an undeclared tool, stays in the content as text: the
    agent (and the reward) sees what the model wrote instead of a silently dropped call.
    """
    return parse_tagged(text, tools)


def _plain_content(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content


class SmolLM2ToolFormat:
    """Tools in the system prompt, calls as `<tool_call>[...]</tool_call>` (see module docstring)."""

    def __init__(self) -> None:
        self.syntax: CallSyntax = SmolLM2Syntax()

    def template_messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        out: list[dict[str, Any]] = []
        for m in messages:
            content = _plain_content(m)
            if m.get("role") == "assistant" and m.get("tool_calls"):
                content = (content + "\n" if content else "") + _call_text(m["tool_calls"])
            out.append({"role": m["role"], "content": content})
        if tools:
            prompt = SMOLLM2_TOOL_PROMPT.format(tools=json.dumps([t.get("function", t) for t in tools]))
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
            else:
                out.insert(0, {"role": "system", "content": prompt})
        return out, None

    def parse(self, text, tools):
        return self.syntax.parse(text, tools)


class TemplateToolFormat:
    """For chat templates that render `tools` and `tool_calls` themselves; calls in the template's syntax."""

    def __init__(self, syntax: CallSyntax | None = None):
        self.syntax: CallSyntax = syntax or syntax_for_template(None)

    def template_messages(self, messages, tools):
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [
                    {**c, "function": {**c["function"], "arguments": _maybe_json(c["function"]["arguments"])}}
                    for c in m["tool_calls"]
                ]
            out.append(m)
        return out, tools

    def parse(self, text, tools):
        return self.syntax.parse(text, tools)


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _call_pair(call: dict[str, Any]) -> tuple[Any, Any]:
    fn = call.get("function", call) if isinstance(call, dict) else {}
    return fn.get("name"), _maybe_json(fn.get("arguments", {}))


def turn_problem(
    fmt: ToolFormat, text: str, message: dict[str, Any], tools: list[dict[str, Any]] | None
) -> str | None:
    """Why `message` does not survive its own rendering, or None when it does.

    `text` is the assistant turn as the chat template writes it (what a model trained on it learns
    to sample). Parsed back with `fmt`, as the policy parses what it samples, it must give the
    message's tool calls (names and arguments) and its content; otherwise a model that learned the
    turn would not make the calls it shows.
    """
    parsed = fmt.parse(text, tools)
    want = [_call_pair(c) for c in message.get("tool_calls") or []]
    got = [_call_pair(c) for c in parsed.tool_calls]
    names = [t.get("function", t).get("name") for t in tools or []]
    for name, args in want:
        if name not in names:
            declared = ", ".join(map(str, names)) if names else "none"
            return f"calls {name!r}, which is not one of the chat's tools ({declared})"
        if not isinstance(args, dict):
            return f"the arguments of its {name!r} call are not a JSON object"
    if got != want:
        return (
            f"its text parses as {len(got)} tool call(s) {[n for n, _ in got]}, not the {len(want)} it holds "
            f"{[n for n, _ in want]} (tool-call markup in its content?)"
        )
    content = _plain_content(message).strip()
    if (parsed.content or "").strip() != content:
        return f"its text parses back to the content {parsed.content!r}, not {content!r}"
    return None


TOOL_FORMATS: dict[str, type] = {"smollm2": SmolLM2ToolFormat, "template": TemplateToolFormat}


def tool_format_for(name: str | None, chat_template: str | None, tokenizer=None) -> ToolFormat:
    """`name` from config wins; otherwise templates that mention `tools` render them natively.

    A template format reads calls in the syntax its template writes (`syntax_for_template`), or
    with the tokenizer's declared `response_template` when it has one.
    """
    if name is not None and name not in TOOL_FORMATS:
        raise ValueError(f"tool_format {name!r} is unknown; choose one of {sorted(TOOL_FORMATS)}")
    if name == "smollm2" or (name is None and not (chat_template and "tools" in chat_template)):
        return SmolLM2ToolFormat()
    syntax = syntax_for_template(chat_template)
    if tokenizer is not None and getattr(tokenizer, "response_template", None) is not None:
        syntax = DeclaredSyntax(tokenizer, syntax)
    return TemplateToolFormat(syntax)
