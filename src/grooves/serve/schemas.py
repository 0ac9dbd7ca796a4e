"""The chat completions API's request and response, as grooves serves them.

Requests are validated by these models (a bad field is a 400 naming it); the objects inside a
request (messages, their parts and tool calls, tools, a named `tool_choice`, `response_format`) are
`serve.closed` models, which refuse a key they do not declare, naming its path. Responses are OpenAI's
chat completion with the fields training needs on every choice (`token_ids`, `prompt_token_ids`,
`sampled_logprobs`, `adapter_version`, `adapter_id`, `temperature`), which the `openai` client
keeps as extra attributes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    field_validator,
)

from grooves.policy.logits import PENALTY_RANGE
from grooves.policy.sampling import MAX_TOP_LOGPROBS, SEED_MAX, SEED_MIN, Completion
from grooves.serve.closed import Closed, one_of, refusal, refused, shaped

log = logging.getLogger("grooves.server")

StrictFloat = Annotated[float, Field(strict=True)]
"""A JSON number; `true` is refused instead of read as 1."""

MAX_USER_CHARS = 256
"""The longest `user` (an end-user id) a request may send; it goes into a log line."""


class TextPart(Closed):
    """A part of a message's content: text, the only kind a text-only model reads."""

    type: str
    text: StrictStr
    prompt_cache_breakpoint: Annotated[Any, refused("no prompt cache")] = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, v: str) -> str:
        if v != "text":
            raise refusal(
                f"is {v!r}: this server serves a text-only model and takes only "
                "{'type': 'text', 'text': '...'} parts"
            )
        return v


_PARTS = TypeAdapter(list[Annotated[dict[str, Any], shaped(TextPart)]])


class ToolCallFunction(Closed):
    name: StrictStr
    arguments: Any = "{}"

    @field_validator("arguments")
    @classmethod
    def _arguments(cls, v):
        if not isinstance(v, str | dict):
            raise refusal("must be a string of JSON (or an object)")
        return v


class ToolCall(Closed):
    """An assistant message's earlier tool call, as the client sends it back."""

    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(Closed):
    """A chat message. `refusal`, `audio`, `function_call` and `annotations` are the fields of the
    `openai` client's own message object that ask for nothing at null: a message the client read goes
    back as it is."""

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None
    name: StrictStr | None = None
    refusal: Annotated[Any, refused("no refusal classifier: send the text as content")] = None
    audio: Annotated[Any, refused("text only")] = None
    function_call: Annotated[Any, refused("deprecated by OpenAI: send tool_calls")] = None
    annotations: Annotated[Any, refused("no web search")] = None

    @field_validator("content", mode="before")
    @classmethod
    def _content_shape(cls, v):
        # checked by hand so the error names `content` (or the part), not one member of the union
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, list) and all(isinstance(p, dict) for p in v):
            return _PARTS.validate_python(v)
        raise ValueError(
            "content must be a string, a list of content parts like {'type': 'text', 'text': '...'}, or null"
        )


class FunctionDefinition(Closed):
    name: StrictStr
    description: StrictStr | None = None
    parameters: Any = None
    """Checked as a JSON schema by the route (`serve.pipeline.validate_tools`)."""
    strict: StrictBool | None = None


class Tool(Closed):
    """A function tool: its name, description and JSON-schema `parameters` are rendered into the
    prompt, `strict` decides how a grammar holds its calls (`policy.constraints`)."""

    type: str
    function: FunctionDefinition

    @field_validator("type")
    @classmethod
    def _function_only(cls, v: str) -> str:
        if v != "function":
            raise refusal(
                f"is {v!r}: this server takes function tools, "
                "{'type': 'function', 'function': {'name': ..., 'parameters': ...}}"
            )
        return v


class ToolName(Closed):
    name: StrictStr


class NamedToolChoice(Closed):
    type: Literal["function"]
    function: ToolName


class TextFormat(Closed):
    type: Literal["text"] = "text"


class JSONObjectFormat(Closed):
    type: Literal["json_object"]


class JSONSchemaSpec(Closed):
    name: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None
    """Accepted as the schema's documentation (LangChain's structured output sends a schema's
    docstring here) and not shown to the model: the schema itself is enforced, by a grammar."""


class JSONSchemaFormat(Closed):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


RESPONSE_FORMATS: dict[str, type[BaseModel]] = {
    "text": TextFormat,
    "json_object": JSONObjectFormat,
    "json_schema": JSONSchemaFormat,
}


class ChatRequest(BaseModel):
    # fields outside this model arrive as extras and are checked against the compatibility table
    # (`serve.compat.check_fields`): refused unless they ask for nothing, never silently ignored
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[Annotated[dict[str, Any], shaped(Tool)]] | None = None
    tool_choice: Any = None
    n: StrictInt = Field(default=1, ge=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0)
    stop: list[str] | None = None
    seed: StrictInt | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    stream: StrictBool | None = False
    stream_options: dict[str, Any] | None = None
    response_format: (
        Annotated[
            dict[str, Any],
            one_of(
                RESPONSE_FORMATS,
                lambda kind: f"is {kind!r}: use 'text', 'json_object' or 'json_schema'",
                lambda fmt: fmt.get("type", "text"),
            ),
        ]
        | None
    ) = None
    logit_bias: dict[str, StrictFloat] | None = None
    presence_penalty: StrictFloat | None = Field(default=None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    frequency_penalty: StrictFloat | None = Field(default=None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    parallel_tool_calls: StrictBool | None = None
    user: StrictStr | None = Field(default=None, max_length=MAX_USER_CHARS)
    """OpenAI's end-user identifier: recorded in the server's log line of the request."""
    return_token_ids: StrictBool | None = None
    """vLLM's: the prompt ids at the top of the response too (choices always carry theirs)."""
    return_tokens_as_token_ids: StrictBool | None = None
    """vLLM's: each logprob entry's `token` is "token_id:N" instead of the token's text."""
    skip_special_tokens: StrictBool | None = None
    """vLLM's: false keeps special tokens in the content (unstreamed)."""

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, v):  # OpenAI's stop is a string or a list of them
        return [v] if isinstance(v, str) else v

    @field_validator("tool_choice")
    @classmethod
    def _named_choice(
        cls, v
    ):  # the strings and other shapes are checked with the tools (`policy.constraints`)
        if isinstance(v, dict) and v.get("type") == "function":
            NamedToolChoice.model_validate(v)
        return v


def logprobs_block(
    tokenizer,
    token_ids: list[int],
    logprobs: list[float],
    top: list[list[tuple[int, float]]] | None = None,
    *,
    as_ids: bool = False,
) -> dict[str, Any]:
    """OpenAI's `logprobs` of a choice: each sampled token's text, bytes and logprob, and its
    `top_logprobs` alternatives (empty unless asked). `as_ids` (vLLM's `return_tokens_as_token_ids`):
    each `token` is "token_id:N", which a client maps back to the id without a tokenizer."""

    def entry(tid: int, lp: float) -> dict[str, Any]:
        text = tokenizer.decode([tid])
        token = f"token_id:{tid}" if as_ids else tokenizer.convert_ids_to_tokens(tid)
        return {"token": token, "logprob": lp, "bytes": list(text.encode())}

    content = []
    for i, (tid, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        alternatives = [entry(t, v) for t, v in top[i]] if top is not None else []
        content.append(entry(tid, lp) | {"top_logprobs": alternatives})
    return {"content": content}


def token_record(
    completion: Completion,
    prompt_ids: list[int],
    *,
    adapter_version: int | None,
    adapter_id: str | None,
    temperature: float,
) -> dict[str, Any]:
    """grooves' fields of a choice: the sample's token record (on a streamed choice's final chunk)."""
    return {
        "token_ids": completion.token_ids,
        "prompt_token_ids": prompt_ids,
        "sampled_logprobs": completion.logprobs,
        "adapter_version": adapter_version,
        "adapter_id": adapter_id,
        "temperature": temperature,
    }


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def choice_body(
    index: int,
    message: dict[str, Any],
    finish_reason: str,
    completion: Completion,
    prompt_ids: list[int],
    *,
    logprobs: dict[str, Any] | None,
    adapter_version: int | None,
    adapter_id: str | None,
    temperature: float,
) -> dict[str, Any]:
    """One choice: OpenAI's fields, then grooves' token record of the sample."""
    return {
        "index": index,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": logprobs,
    } | token_record(
        completion,
        prompt_ids,
        adapter_version=adapter_version,
        adapter_id=adapter_id,
        temperature=temperature,
    )


def completion_body(
    model: str, choices: list[dict[str, Any]], prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A `chat.completion` object around its choices, with the token usage."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_body(prompt_tokens, completion_tokens),
    }


def log_answer(req: ChatRequest, prompt_tokens: int, choices: list[tuple[Completion, str]]) -> None:
    """One line per answered request on `grooves.server`, with the caller's `user` (OpenAI's end-user
    id; `-` when it sent none) and each choice's finish reason."""
    log.info(
        "chat completion model=%s user=%s n=%d prompt_tokens=%d completion_tokens=%d finish=%s",
        json.dumps(req.model),
        json.dumps(req.user) if req.user is not None else "-",
        req.n,
        prompt_tokens,
        sum(len(c.token_ids) for c, _ in choices),
        ",".join(finish for _, finish in choices),
    )


def with_special_tokens(
    tokenizer, eos_token_ids: set[int], completion: Completion, stop: list[str]
) -> Completion:
    """The completion with its text decoded keeping special tokens (vLLM's `skip_special_tokens:
    false`): the end-of-turn token left out and the text cut before a stop string, as the sampler's own text is."""
    ids = completion.token_ids
    body = ids[:-1] if ids and ids[-1] in eos_token_ids else ids
    text = tokenizer.decode(body, skip_special_tokens=False)
    for s in stop:
        cut = text.find(s)
        if cut >= 0:
            text = text[:cut]
    return dataclasses.replace(completion, text=text)
