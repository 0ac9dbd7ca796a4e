"""An OpenAI-compatible chat completions server over a grooves policy.

Agent code talks to grooves exactly as to any OpenAI-style model: `/v1/models` and
`/v1/chat/completions` with `n`, `logprobs`, `tools` and multi-turn messages, usable by the
official `openai` client. Each choice also carries the fields training needs, which the
`openai` client keeps as extra attributes:

- `token_ids`: the sampled token ids (ending with the end-of-turn token when the model stopped);
- `prompt_token_ids`: the exact prompt ids the policy conditioned on;
- `sampled_logprobs`: the logprob of each sampled token (also in the standard `logprobs` field);
- `adapter_version`: which training step's adapter produced it (for an extra adapter: which
  promotion of its name);
- `adapter_id`: which loaded adapter produced it (null: the policy's own weights).

One server can serve several LoRA adapters on one base model: `/v1/models` lists every name, the
request's `model` picks one, and `/v1/adapters` (see `grooves.adapters.admin`) loads, unloads,
promotes and rolls them back at run time (`grooves.adapters.live` keeps swaps atomic).

`inprocess_client(policy)` gives an `openai.AsyncOpenAI` that reaches this app over an in-memory
ASGI transport: the trainer and tests use the same code path as a remote agent, without a port.

Bad input is a 4xx with an OpenAI-style JSON error body naming the parameter, never a 500 with a
traceback.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any, Literal

import jsonschema
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from grooves.adapters.live import AdapterTable, UnknownModel
from grooves.policy.batching import BatchScheduler
from grooves.policy.sampling import SamplingParams
from grooves.policy.transformers_policy import ContextOverflow

log = logging.getLogger("grooves.server")

_FN_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


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
        raise ValueError("content must be a string, a list of content parts like {'type': 'text', 'text': '...'}, or null")


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    n: int = Field(default=1, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=0)
    stream: bool = False

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        return [v] if isinstance(v, str) else v


def validate_tools(tools: list[dict[str, Any]] | None) -> None:
    """OpenAI function tools: a name matching [a-zA-Z0-9_-]{1,64} and a JSON-schema `parameters`."""
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise APIError(400, f"{where}: expected {{'type': 'function', 'function': {{...}}}}", param=where)
        fn = tool["function"]
        if not isinstance(fn.get("name"), str) or not _FN_NAME.match(fn["name"]):
            raise APIError(400, f"{where}.function.name must match [a-zA-Z0-9_-]{{1,64}}", param=f"{where}.function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        try:
            jsonschema.Draft202012Validator.check_schema(params)
        except jsonschema.SchemaError as exc:
            raise APIError(
                400, f"{where}.function.parameters is not a valid JSON schema: {exc.message}", param=f"{where}.function.parameters"
            ) from exc
        if not isinstance(params, dict) or params.get("type", "object") != "object":  # `true` is a valid schema too
            raise APIError(400, f"{where}.function.parameters must be an object schema", param=f"{where}.function.parameters")


def _logprobs_block(tokenizer, token_ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    content = []
    for tid, lp in zip(token_ids, logprobs, strict=True):
        tok = tokenizer.convert_ids_to_tokens(tid)
        text = tokenizer.decode([tid])
        content.append({"token": tok, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": content}


def create_app(
    policy, *, max_n: int = 64, max_batch_rows: int = 64, adapters: AdapterTable | None = None, admin: bool = True
) -> FastAPI:
    """The HTTP app. `policy` is a `TransformersPolicy` (or anything with its interface).

    `adapters` routes model names to adapters (default: the policy's own name only); `admin`
    mounts the /v1/adapters endpoints that change them.
    """
    from grooves.adapters.admin import admin_router
    from grooves.adapters.promote import Promoter

    app = FastAPI(title="grooves policy server")
    scheduler = BatchScheduler(policy, max_batch_rows=max_batch_rows)
    adapters = adapters or AdapterTable(policy)
    app.state.policy = policy
    app.state.scheduler = scheduler
    app.state.adapters = adapters
    app.state.promoter = Promoter(adapters)
    if admin:
        app.include_router(admin_router(adapters, app.state.promoter))

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        body = {"error": {"message": exc.message, "type": "invalid_request_error", "param": exc.param, "code": exc.code}}
        return JSONResponse(status_code=exc.status, content=body)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        if first.get("type") == "json_invalid":  # the loc of a JSON error is a character offset
            loc, first = "", {"msg": f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})"}
        message = f"{loc}: {first.get('msg')}" if loc else str(first.get("msg"))
        body = {"error": {"message": message, "type": "invalid_request_error", "param": loc or None, "code": None}}
        return JSONResponse(status_code=400, content=body)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        log.exception("unexpected error")
        body = {"error": {"message": f"internal error: {type(exc).__name__}", "type": "server_error", "param": None, "code": None}}
        return JSONResponse(status_code=500, content=body)

    @app.get("/v1/models")
    async def models():
        data = [
            {"id": r.name, "object": "model", "owned_by": "grooves", "created": 0}
            | ({"parent": policy.served_name, "root": r.path} if r.name != policy.served_name else {})
            for r in adapters.routes()
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        if req.model not in adapters.names():
            raise APIError(404, f"model {req.model!r} is not served here; available: {adapters.names()}", "model", "model_not_found")
        if req.stream:
            raise APIError(400, "stream=true is not supported; request without streaming", "stream")
        if req.n > max_n:
            raise APIError(400, f"n={req.n} is larger than this server's limit of {max_n}", "n")
        validate_tools(req.tools)
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        tools = req.tools if req.tool_choice != "none" else None
        max_tokens = req.max_completion_tokens or req.max_tokens or 256
        try:
            prompt_ids = policy.render(messages, tools)
            policy.check_fits(prompt_ids, max_tokens)
        except ContextOverflow as exc:
            raise APIError(400, str(exc), "messages", "context_length_exceeded") from exc
        except (KeyError, TypeError, ValueError) as exc:  # a message the chat template cannot render
            raise APIError(400, f"messages could not be rendered by the chat template: {exc}", "messages") from exc
        params = SamplingParams(
            n=req.n, max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, stop=req.stop or [], seed=req.seed
        )
        try:
            with adapters.lease(req.model) as route:  # the adapter stays loaded until this request is answered
                version = adapters.version_of(route)
                completions = await scheduler.submit(prompt_ids, params, adapter=route.adapter_id)
        except UnknownModel as exc:  # removed while this request was being rendered
            raise APIError(404, str(exc), "model", "model_not_found") from exc
        return _response(policy, req, messages, tools, prompt_ids, completions, version, route.adapter_id)

    return app


def _response(policy, req: ChatRequest, messages, tools, prompt_ids, completions, version, adapter_id=None) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(completions):
        parsed = policy.parse(c.text, tools)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        policy.remember(messages, tools, message, prompt_ids, c)
        finish = "tool_calls" if parsed.tool_calls else c.finish_reason
        choices.append(
            {
                "index": i,
                "message": message,
                "finish_reason": finish,
                "logprobs": _logprobs_block(policy.tokenizer, c.token_ids, c.logprobs) if req.logprobs else None,
                "token_ids": c.token_ids,
                "prompt_token_ids": prompt_ids,
                "sampled_logprobs": c.logprobs,
                "adapter_version": version,
                "adapter_id": adapter_id,
                "temperature": req.temperature,
            }
        )
    completion_tokens = sum(len(c.token_ids) for c in completions)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        },
    }


def inprocess_client(policy_or_app, *, api_key: str = "grooves", timeout: float = 600.0):
    """An `openai.AsyncOpenAI` client wired to the app in this process (no sockets)."""
    import httpx
    from openai import AsyncOpenAI

    app = policy_or_app if isinstance(policy_or_app, FastAPI) else create_app(policy_or_app)
    transport = httpx.ASGITransport(app=app)
    http = httpx.AsyncClient(transport=transport, base_url="http://grooves.local", timeout=timeout)
    return AsyncOpenAI(base_url="http://grooves.local/v1", api_key=api_key, http_client=http, max_retries=0)


def serve(
    policy, *, host: str = "127.0.0.1", port: int = 8000, max_n: int = 64, adapters: AdapterTable | None = None, admin: bool = True
) -> None:
    import uvicorn

    uvicorn.run(create_app(policy, max_n=max_n, adapters=adapters, admin=admin), host=host, port=port, log_level="info")
