"""The chat completions API's request and response, as grooves serves them.

Requests are validated by these models (a bad field is a 400 naming it); responses are OpenAI's
chat completion with the fields training needs on every choice (`token_ids`, `prompt_token_ids`,
`sampled_logprobs`, `adapter_version`, `adapter_id`, `temperature`), which the `openai` client
keeps as extra attributes.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from grooves.policy.sampling import SEED_MAX, SEED_MIN, Completion

StrictFloat = Annotated[float, Field(strict=True)]
"""A JSON number; `true` is refused instead of read as 1."""


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    """An assistant message's earlier tool call, as the client sends it back."""

    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content_shape(cls, v):
        # checked by hand so the error names `content`, not one member of the union
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, list) and all(isinstance(p, dict) for p in v):
            return v
        raise ValueError(
            "content must be a string, a list of content parts like {'type': 'text', 'text': '...'}, or null"
        )


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    n: StrictInt = Field(default=1, ge=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: StrictInt | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=0)
    stream: StrictBool = False
    # accepted only at the values that change nothing (see `refuse_unsupported`)
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, Any] | None = None
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        return [v] if isinstance(v, str) else v


def logprobs_block(tokenizer, token_ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """OpenAI's `logprobs` of a choice: each sampled token's text, bytes and logprob (no alternatives)."""
    content = []
    for tid, lp in zip(token_ids, logprobs, strict=True):
        tok = tokenizer.convert_ids_to_tokens(tid)
        text = tokenizer.decode([tid])
        content.append({"token": tok, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": content}


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
        "token_ids": completion.token_ids,
        "prompt_token_ids": prompt_ids,
        "sampled_logprobs": completion.logprobs,
        "adapter_version": adapter_version,
        "adapter_id": adapter_id,
        "temperature": temperature,
    }


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
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
