"""A Responses API request read as the chat request the server already answers.

`POST /v1/responses` is not a second sampling path: its input items, instructions, function
tools, `tool_choice` and `text.format` are turned into a `ChatRequest` (`as_chat_request`), which
goes through the chat route's own preparation (rendering with token continuity, tool checks,
grammars) and sampling, the request pipeline of `serve.pipeline`. The request was checked by
`serve.responses.request` (what cannot be turned into chat is a 400 naming the item or field
there); here:

- `input` items: a `message` is a chat message (its text parts joined), a `function_call` is
  joined to the assistant message before it (so a turn the server sampled comes back as the one
  assistant message it remembered), a `function_call_output` is a `tool` message;
- `tools`: flat in Responses, nested under `function` in chat;
- `tool_choice`: `{"type": "function", "name": ...}` is chat's `{"type": "function", "function": {"name": ...}}`;
- `text.format`: chat's `response_format` (a json_schema's name, schema and strict under `json_schema`).

Errors found by the chat checks name chat fields; `responses_param` names the Responses field instead.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from grooves.serve.closed import request_error
from grooves.serve.errors import APIError
from grooves.serve.responses.request import ResponsesRequest
from grooves.serve.schemas import ChatRequest


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of a request's `input` (checked by `ResponsesRequest`; see the module docstring)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _text(item["content"])})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:  # function_call_output
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])}
            )
    return messages


def _text(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (`{"type": "function", "name", "parameters", ...}`) in chat's shape."""
    if not tools:
        return None
    keep = ("name", "description", "parameters", "strict")
    return [{"type": "function", "function": {k: t[k] for k in keep if t.get(k) is not None}} for t in tools]


def chat_tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(
        400,
        'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
        "tool_choice",
    )


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format` (`text.verbosity` is refused by `TextConfig`)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if fmt["type"] == "json_schema":
        spec = {k: v for k, v in fmt.items() if k != "type"}
        return {"type": "json_schema", "json_schema": spec}
    return fmt


def as_chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> ChatRequest:
    """The chat request that answers `req`: instructions, then the stored `history` (its
    `previous_response_id`), then its input."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + [
        *history,
        *input_messages(req.input),
    ]
    if not messages:
        raise APIError(400, "input is empty: send at least one item", "input")
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "logprobs": req.wants_logprobs,
        "top_logprobs": req.top_logprobs,
        "response_format": chat_response_format(req.text),
        "stream": req.stream,
        "user": req.user,
    }
    try:
        return ChatRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:  # the Responses request was checked: a chat field it cannot fill
        raise request_error(exc) from None


_PARAMS = (
    (re.compile(r"^messages\b.*"), "input"),
    (re.compile(r"^tools\[(\d+)\]\.function"), r"tools[\1]"),
    (re.compile(r"^response_format\.json_schema"), "text.format"),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^max_tokens$"), "max_output_tokens"),
)


def responses_param(param: str | None) -> str | None:
    """The Responses field a chat check's `param` stands for.

    >>> responses_param("tools[2].function.parameters")
    'tools[2].parameters'
    >>> responses_param("response_format.json_schema.schema")
    'text.format.schema'
    """
    if param is None:
        return None
    for pattern, repl in _PARAMS:
        if pattern.search(param):
            return pattern.sub(repl, param, count=1)
    return param


def renamed(exc: APIError) -> APIError:
    """A chat check's error, naming the Responses field."""
    param = responses_param(exc.param)
    message = exc.message
    if exc.param and param and param != exc.param:
        message = message.replace(exc.param, param)
        message = message.replace("max_tokens", "max_output_tokens").replace("response_format", "text.format")
    return APIError(exc.status, message, param, exc.code, exc.kind)
