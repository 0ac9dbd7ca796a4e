"""A Responses API request read as the chat request the server already answers.

`POST /v1/responses` is not a second sampling path: its input items, instructions, function
tools, `tool_choice` and `text.format` are turned into a `ChatRequest` (`as_chat_request`), which
goes through the chat route's own preparation (rendering with token continuity, tool checks,
grammars) and sampling. What cannot be turned into chat is a 400 naming the item or field:

- `input` items: `message` (user, system, developer, assistant; text parts only),
  `function_call` (joined to the assistant message before it, so a turn the server sampled comes
  back as the one assistant message it remembered), `function_call_output` (a `tool` message);
- `tools`: function tools only (flat in Responses, nested under `function` in chat);
- `tool_choice`: the strings, or `{"type": "function", "name": ...}`;
- `text.format`: text, json_object, or json_schema (its name, schema and strict beside `type`).

Errors found by the chat checks name chat fields; `responses_param` names the Responses field instead.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from grooves.policy.sampling import MAX_TOP_LOGPROBS
from grooves.serve.errors import APIError
from grooves.serve.schemas import MAX_USER_CHARS, ChatRequest

StrictFloat = Annotated[float, Field(strict=True)]

_TEXT_PARTS = {"input_text", "output_text", "text"}


class ResponsesRequest(BaseModel):
    # fields outside this model arrive as extras, checked against `responses_fields.RESPONSES_FIELDS`
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict[str, Any]]
    instructions: StrictStr | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0)
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    include: list[str] | None = None
    text: dict[str, Any] | None = None
    stream: StrictBool | None = False
    previous_response_id: StrictStr | None = None
    store: StrictBool | None = True
    metadata: dict[str, StrictStr] | None = None
    user: StrictStr | None = Field(default=None, max_length=MAX_USER_CHARS)

    @property
    def wants_logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or []) or bool(self.top_logprobs)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of a request's `input` (see the module docstring)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {
                "id": _text_field(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _text_field(item, "name", where),
                    "arguments": _text_field(item, "arguments", where),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _parts_text(output, f"{where}.output")
            messages.append(
                {"role": "tool", "tool_call_id": _text_field(item, "call_id", where), "content": content}
            )
        else:
            raise APIError(
                400,
                f"{where}.type is {kind!r}: this server takes message, function_call and function_call_output "
                "items (a text-only model with function tools)",
                f"{where}.type",
            )
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise APIError(
            400, f"{where}.role must be user, system, developer or assistant, not {role!r}", f"{where}.role"
        )
    content = item.get("content")
    text = content if isinstance(content, str) else _parts_text(content, f"{where}.content")
    return {"role": role, "content": text}


def _parts_text(parts: Any, where: str) -> str:
    if not isinstance(parts, list):
        raise APIError(400, f"{where} must be a string or a list of text parts", where)
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise APIError(
                400,
                f"{where}[{j}].type is {kind!r}: this server serves a text-only model and takes only "
                "input_text and output_text parts",
                f"{where}[{j}].type",
            )
        texts.append(part["text"])
    return "".join(texts)


def _text_field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise APIError(400, f"{where}.{name} must be a string", f"{where}.{name}")
    return value


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (`{"type": "function", "name", "parameters", ...}`) in chat's shape."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(
                400,
                f"tools[{i}].type is {tool.get('type')!r}: this server runs no hosted tools; send function tools",
                f"tools[{i}].type",
            )
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


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
    """`text.format` as chat's `response_format`; `text.verbosity` is refused."""
    if not text:
        return None
    extra = sorted(set(text) - {"format", "verbosity"})
    if extra:
        raise APIError(400, f"text.{extra[0]} is not a field of text; it takes format", f"text.{extra[0]}")
    if text.get("verbosity") is not None:
        raise APIError(
            400,
            "text.verbosity is not supported by this server (no verbosity control); remove it",
            "text.verbosity",
        )
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise APIError(400, "text.format must be an object", "text.format")
    if fmt.get("type") == "json_schema":
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
    return ChatRequest.model_validate({k: v for k, v in body.items() if v is not None})


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
