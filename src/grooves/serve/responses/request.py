"""The Responses API request as the server checks it: `ResponsesRequest` and the objects inside it.

Its top-level fields are checked against `fields.RESPONSES_FIELDS` (a field outside the
model arrives as an extra); the objects inside them are `serve.closed` models, which refuse a key
they do not declare, naming its path (`tools[0].defer_loading`, `input[2].content[0].type`):

- `input` items: `message` (roles user, system, developer, assistant; `input_text` and
  `output_text` parts), `function_call`, `function_call_output`; their `id` and `status`, what an
  item the server sent carries, are accepted and not read, and so are an `output_text` part's
  `annotations` and `logprobs`;
- `tools`: function tools (`name`, `description`, `parameters`, `strict`); `defer_loading`,
  `allowed_callers`, `output_schema` and `async` pass only at values that ask for nothing;
- `tool_choice`: the strings, or `{"type": "function", "name": ...}`;
- `text`: `format` (text, json_object, or json_schema with its name, schema and strict).

The objects are kept as the dicts they came as; `serve.responses.input` turns them into chat.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    field_validator,
)

from grooves.policy.sampling import MAX_TOP_LOGPROBS
from grooves.serve.closed import Closed, one_of, refusal, refused, shaped
from grooves.serve.schemas import MAX_USER_CHARS, JSONSchemaSpec

StrictFloat = Annotated[float, Field(strict=True)]

MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
"""OpenAI's limits on `metadata`: 16 keys, each at most 64 characters, each value at most 512."""

_STATUS = Literal["in_progress", "completed", "incomplete"]
_ASYNC = "calls are answered in the request; false is accepted"
_DIRECT = 'the model calls tools itself; ["direct"] is accepted'
_CALLER = 'the model calls tools itself; {"type": "direct"} is accepted'


class InputText(Closed):
    type: Literal["input_text", "text"]
    text: StrictStr
    prompt_cache_breakpoint: Annotated[Any, refused("no prompt cache")] = None


class OutputText(Closed):
    """An earlier output's text, sent back: its `annotations` and `logprobs` describe that output and
    are not read."""

    type: Literal["output_text"]
    text: StrictStr
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


_PARTS = TypeAdapter(
    list[
        Annotated[
            dict[str, Any],
            one_of(
                {"input_text": InputText, "text": InputText, "output_text": OutputText},
                lambda kind: (
                    f"is {kind!r}: this server serves a text-only model and takes only input_text and "
                    "output_text parts"
                ),
            ),
        ]
    ]
)


def _text_parts(v: Any) -> Any:
    """A string, or a list of text parts (checked)."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return _PARTS.validate_python(v)
    raise refusal("must be a string or a list of text parts")


class MessageItem(Closed):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Annotated[Any, AfterValidator(_text_parts)]
    id: StrictStr | None = None
    status: _STATUS | None = None
    phase: Annotated[Any, refused("no commentary phases: an assistant message is its answer")] = None


class FunctionCallItem(Closed):
    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr
    id: StrictStr | None = None
    status: _STATUS | None = None
    namespace: Annotated[Any, refused("no tool namespaces")] = None
    caller: Annotated[Any, refused(_CALLER, {"type": "direct"})] = None
    async_: Annotated[Any, refused(_ASYNC, False)] = Field(default=None, alias="async")


class FunctionCallOutputItem(Closed):
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: Annotated[Any, AfterValidator(_text_parts)]
    id: StrictStr | None = None
    status: _STATUS | None = None
    name: Annotated[Any, refused("the call_id names the call")] = None
    namespace: Annotated[Any, refused("no tool namespaces")] = None
    caller: Annotated[Any, refused(_CALLER, {"type": "direct"})] = None


_ITEMS = TypeAdapter(
    list[
        Annotated[
            dict[str, Any],
            one_of(
                {
                    "message": MessageItem,
                    "function_call": FunctionCallItem,
                    "function_call_output": FunctionCallOutputItem,
                },
                lambda kind: (
                    f"is {kind!r}: this server takes message, function_call and function_call_output "
                    "items (a text-only model with function tools)"
                ),
                lambda item: item.get("type", "message" if "role" in item else None),
            ),
        ]
    ]
)


class FunctionTool(Closed):
    """A function tool, flat as Responses sends it; read as chat's (`chat_tools`)."""

    type: Literal["function"]
    name: StrictStr
    parameters: Any = None
    strict: StrictBool | None = None
    description: StrictStr | None = None
    defer_loading: Annotated[
        Any, refused("no tool search: every tool is in the prompt; false is accepted", False)
    ] = None
    allowed_callers: Annotated[Any, refused(_DIRECT, ["direct"])] = None
    output_schema: Annotated[Any, refused("a tool's output is read as text")] = None
    async_: Annotated[Any, refused(_ASYNC, False)] = Field(default=None, alias="async")


class ToolChoiceFunction(Closed):
    type: Literal["function"]
    name: StrictStr


class TextFormat(Closed):
    type: Literal["text"]


class JSONObjectFormat(Closed):
    type: Literal["json_object"]


class JSONSchemaFormat(JSONSchemaSpec):
    """Chat Completions' `json_schema` object with its `type` beside its fields (Responses' shape)."""

    type: Literal["json_schema"]


class TextConfig(Closed):
    format: (
        Annotated[
            dict[str, Any],
            one_of(
                {"text": TextFormat, "json_object": JSONObjectFormat, "json_schema": JSONSchemaFormat},
                lambda kind: f"is {kind!r}: use 'text', 'json_object' or 'json_schema'",
            ),
        ]
        | None
    ) = None
    verbosity: Annotated[Any, refused("no verbosity control")] = None


class ResponsesRequest(BaseModel):
    # fields outside this model arrive as extras, checked against `fields.RESPONSES_FIELDS`;
    # the objects inside these fields are `serve.closed` models (checked, and kept as the dicts they came as)
    model_config = ConfigDict(extra="allow")

    model: str
    input: Any
    instructions: StrictStr | None = None
    tools: (
        list[
            Annotated[
                dict[str, Any],
                one_of(
                    {"function": FunctionTool},
                    lambda kind: f"is {kind!r}: this server runs no hosted tools; send function tools",
                ),
            ]
        ]
        | None
    ) = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0)
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    include: list[str] | None = None
    text: Annotated[dict[str, Any], shaped(TextConfig)] | None = None
    stream: StrictBool | None = False
    previous_response_id: StrictStr | None = None
    store: StrictBool | None = True
    metadata: dict[str, StrictStr] | None = None
    user: StrictStr | None = Field(default=None, max_length=MAX_USER_CHARS)

    @field_validator("input")
    @classmethod
    def _items(cls, v):
        if isinstance(v, str):
            return v
        if isinstance(v, list):
            return _ITEMS.validate_python(v)
        raise refusal("must be a string or a list of items")

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, v):
        if v is None:
            return v
        if len(v) > MAX_METADATA_KEYS:
            raise refusal(f"has {len(v)} keys: at most {MAX_METADATA_KEYS}, as OpenAI's")
        for key, value in v.items():
            if len(key) > MAX_METADATA_KEY_CHARS:
                raise refusal(
                    f"key {key[:20]!r}... has {len(key)} characters: at most {MAX_METADATA_KEY_CHARS}, as OpenAI's"
                )
            if len(value) > MAX_METADATA_VALUE_CHARS:
                raise refusal(
                    f"value of {key[:20]!r} has {len(value)} characters: at most {MAX_METADATA_VALUE_CHARS},"
                    " as OpenAI's"
                )
        return v

    @field_validator("tool_choice")
    @classmethod
    def _named_choice(cls, v):  # the strings are checked with the tools (`policy.constraints`)
        if isinstance(v, dict) and v.get("type") == "function":
            ToolChoiceFunction.model_validate(v)
        return v

    @property
    def wants_logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or []) or bool(self.top_logprobs)
