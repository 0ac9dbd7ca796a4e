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
traceback; input the server cannot honour (an image part, `response_format`, a forced
`tool_choice`) is refused the same way rather than dropped. Limits (see docs/serving.md): the
request body (`max_body_bytes`, 413), the largest `n`, and the tokens one request may ask the
sampler for (`n x max_tokens` at most `max_request_tokens`). Prompts are rendered and tokenized on
a worker thread, so a long one does not stall the event loop. A failure while sampling fails only
the request that caused it (a JSON 500 that leaves the connection open), and a request whose
client disconnects is withdrawn from the sampler at its next decode step.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import Annotated, Any, Literal

import jsonschema
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from grooves.adapters.live import AdapterTable, UnknownModel
from grooves.asgi import ApiKey, BodyLimit, ServerErrors
from grooves.policy.batching import BatchScheduler
from grooves.policy.constraints import ConstraintError
from grooves.policy.logits import LOGIT_BIAS_RANGE, PENALTY_RANGE
from grooves.policy.sampling import MAX_TOP_LOGPROBS, SEED_MAX, SEED_MIN, Completion, SamplingParams
from grooves.policy.transformers_policy import ContextOverflow
from grooves.serve import compat
from grooves.serve.streaming import ChoiceStream, ChunkWriter, forward_events, logprob_content, sse

log = logging.getLogger("grooves.server")

_FN_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

MAX_BODY_BYTES = 8 * 2**20
"""Default request body cap: a context of 128k tokens is about 0.5 MB of text."""
MAX_REQUEST_TOKENS = 65_536
"""Default cap on `n x max_tokens` for one request (64 x 1024), so one request cannot hold the
sampler for minutes while every other request waits behind it."""

StrictFloat = Annotated[float, Field(strict=True)]
"""A JSON number; `true` is refused instead of read as 1."""


class APIError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, kind: str = "invalid_request_error"
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def _error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None):
    """OpenAI's error shape; `kind` is its `type` field."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


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
    # fields outside this model arrive as extras and are checked against the compatibility table
    # (`serve.compat.check_fields`): refused unless they ask for nothing, never silently ignored
    model_config = ConfigDict(extra="allow")

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
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    stream: StrictBool | None = False
    stream_options: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, StrictFloat] | None = None
    presence_penalty: StrictFloat | None = Field(default=None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    frequency_penalty: StrictFloat | None = Field(default=None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    parallel_tool_calls: StrictBool | None = None

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


def check_content(messages: list[Message]) -> None:
    """Only text reaches a text model: an image, audio or file part is refused, not silently dropped."""
    for i, m in enumerate(messages):
        if not isinstance(m.content, list):
            continue
        for j, part in enumerate(m.content):
            where = f"messages[{i}].content[{j}]"
            if part.get("type") != "text":
                raise APIError(
                    400, f"{where}.type is {part.get('type')!r}: this server serves a text-only model and takes "
                    "only {'type': 'text', 'text': '...'} parts", f"{where}.type",
                )
            if not isinstance(part.get("text"), str):
                raise APIError(400, f"{where}.text must be a string", f"{where}.text")


def check_fields(req: ChatRequest) -> None:
    """Every field the request sent is one this server implements (`serve.compat`), used consistently."""
    sent = {name: getattr(req, name) for name in req.model_fields_set} | dict(req.model_extra or {})
    try:
        compat.check_fields(sent)
    except compat.FieldRefused as exc:
        raise APIError(400, str(exc), exc.param) from exc
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    if req.stream_options is not None:
        if not req.stream:
            raise APIError(400, "stream_options is only allowed with stream: true", "stream_options")
        unknown = sorted(set(req.stream_options) - {"include_usage"})
        if unknown:
            raise APIError(400, f"stream_options.{unknown[0]} is not supported; only include_usage is", f"stream_options.{unknown[0]}")
        if not isinstance(req.stream_options.get("include_usage", False), bool):
            raise APIError(400, "stream_options.include_usage must be true or false", "stream_options.include_usage")
    if req.parallel_tool_calls is False and req.tools and req.tool_choice in (None, "auto"):
        raise APIError(
            400, "parallel_tool_calls: false is only enforced with a forced tool_choice ('required' or a named function); "
            "with 'auto' the model may write several calls", "parallel_tool_calls",
        )


def logit_bias_of(req: ChatRequest, vocab_size: int) -> dict[int, float]:
    """The request's logit_bias as token id -> value, checked (400 naming `logit_bias`)."""
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        if not key.lstrip("-").isdigit() or not 0 <= int(key) < vocab_size:
            raise APIError(400, f"logit_bias key {key!r} is not a token id of this model (0 .. {vocab_size - 1})", "logit_bias")
        if not LOGIT_BIAS_RANGE[0] <= value <= LOGIT_BIAS_RANGE[1]:
            raise APIError(400, f"logit_bias[{key!r}] = {value} is outside {list(LOGIT_BIAS_RANGE)}", "logit_bias")
        bias[int(key)] = float(value)
    return bias


def constraint_of(policy, req: ChatRequest, tools):
    """The grammar `response_format` / `tool_choice` impose (None: none); 400 naming the field it cannot enforce."""
    wants = (req.response_format or {}).get("type", "text") != "text" or req.tool_choice not in (None, "auto", "none")
    if not wants:
        return None
    build = getattr(policy, "constraint_for", None)
    if build is None:
        raise APIError(400, "this policy's backend has no constrained decoding (response_format, a forced tool_choice)", "response_format")
    try:
        return build(
            response_format=req.response_format, tools=tools, tool_choice=req.tool_choice,
            parallel_tool_calls=req.parallel_tool_calls is not False,
        )
    except ConstraintError as exc:
        raise APIError(400, str(exc), exc.param) from exc


def _logprobs_block(tokenizer, token_ids: list[int], logprobs: list[float], top=None) -> dict[str, Any]:
    return {"content": logprob_content(tokenizer, token_ids, logprobs, top)}


def create_app(
    policy,
    *,
    max_n: int = 64,
    max_batch_rows: int = 64,
    adapters: AdapterTable | None = None,
    admin: bool = False,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_request_tokens: int | None = MAX_REQUEST_TOKENS,
    api_key: str | None = None,
) -> FastAPI:
    """The HTTP app. `policy` is a `TransformersPolicy` (or anything with its interface).

    `adapters` routes model names to adapters (default: the policy's own name only); `admin`
    mounts the /v1/adapters endpoints that change them (off by default: they load any path on the
    server's disk). `api_key`, when set, is required on every route as `Authorization: Bearer
    <key>` (401 otherwise). `max_body_bytes` caps a request body (413); `max_request_tokens` caps
    `n x max_tokens` of one request (400; None: no cap).
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
    app.add_middleware(
        BodyLimit, max_bytes=max_body_bytes,
        too_large=lambda limit: _error_body(f"the request body is larger than this server's limit of {limit} bytes", code="request_too_large"),
    )
    app.add_middleware(ServerErrors, body=lambda exc: _error_body(f"internal error: {type(exc).__name__}", kind="server_error"))
    if api_key is not None:  # outermost: a request without the key is refused before its body is read
        app.add_middleware(
            ApiKey, key=api_key,
            unauthorized=lambda reason: _error_body(
                f"{reason}: send it as the header 'Authorization: Bearer <key>' (the openai client's api_key)", code="invalid_api_key"
            ),
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # unknown routes and methods: OpenAI's error shape, not FastAPI's {"detail": ...}
        if exc.status_code == 404:
            message, code = f"no route {request.method} {request.url.path}; this server has /v1/models, /v1/chat/completions, /health", "not_found"
        elif exc.status_code == 405:
            message, code = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        else:
            message, code = str(exc.detail), None
        return JSONResponse(status_code=exc.status_code, content=_error_body(message, code=code), headers=exc.headers)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return JSONResponse(status_code=exc.status, content=_error_body(exc.message, kind=exc.kind, param=exc.param, code=exc.code))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        if first.get("type") == "json_invalid":  # the loc of a JSON error is a character offset
            loc, first = "", {"msg": f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})"}
        message = f"{loc}: {first.get('msg')}" if loc else str(first.get("msg"))
        return JSONResponse(status_code=400, content=_error_body(message, param=loc or None))

    @app.get("/v1/models")
    async def models():
        data = [
            {"id": r.name, "object": "model", "owned_by": "grooves", "created": 0}
            | ({"parent": policy.served_name, "root": r.path} if r.name != policy.served_name else {})
            for r in adapters.routes()
        ]
        return {"object": "list", "data": data}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        for entry in (await models())["data"]:
            if entry["id"] == model_id:
                return entry
        raise APIError(404, f"model {model_id!r} is not served here; available: {adapters.names()}", "model", "model_not_found")

    @app.get("/health")
    async def health():
        counters = scheduler.counters
        calls = getattr(policy, "tool_calls", None)
        return {
            "status": "ok",
            "models": adapters.names(),
            "adapter_version": getattr(policy, "adapter_version", None),
            "sampler": {"batches": counters.batches, "failed_requests": counters.failed_requests, "cancelled_requests": counters.cancelled_requests},
            "tool_calls": {"parsed": calls.parsed, "unparsed": calls.unparsed} if calls is not None else None,
        }

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        if req.model not in adapters.names():
            raise APIError(404, f"model {req.model!r} is not served here; available: {adapters.names()}", "model", "model_not_found")
        check_fields(req)
        if req.n > max_n:
            raise APIError(400, f"n={req.n} is larger than this server's limit of {max_n}", "n")
        max_tokens = req.max_completion_tokens or req.max_tokens or 256
        if max_request_tokens is not None and req.n * max_tokens > max_request_tokens:
            name = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
            raise APIError(
                400, f"n x {name} = {req.n} x {max_tokens} = {req.n * max_tokens} tokens is more than this server's "
                f"limit of {max_request_tokens} per request; lower n or {name}", name,
            )
        check_content(req.messages)
        validate_tools(req.tools)
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        tools = req.tools if req.tool_choice != "none" else None

        def render() -> list[int]:  # tokenizing a long prompt takes a while: not on the event loop
            ids = policy.render(messages, tools)
            policy.check_fits(ids, max_tokens)
            return ids

        try:
            prompt_ids = await asyncio.to_thread(render)
        except ContextOverflow as exc:
            raise APIError(400, str(exc), "messages", "context_length_exceeded") from exc
        except (KeyError, TypeError, ValueError) as exc:  # a message the chat template cannot render
            raise APIError(400, f"messages could not be rendered by the chat template: {exc}", "messages") from exc
        params = SamplingParams(
            n=req.n, max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, stop=req.stop or [], seed=req.seed,
            logit_bias=logit_bias_of(req, int(policy.model.config.vocab_size)),
            frequency_penalty=req.frequency_penalty or 0.0, presence_penalty=req.presence_penalty or 0.0,
            top_logprobs=req.top_logprobs or 0, constraint=constraint_of(policy, req, tools),
        )
        if req.stream:
            return _stream(policy, scheduler, adapters, req, messages, tools, prompt_ids, params)
        try:
            with adapters.lease(req.model) as route:  # the adapter stays loaded until this request is answered
                version = adapters.version_of(route)
                completions = await _sample_unless_gone(scheduler, request, prompt_ids, params, route.adapter_id)
        except UnknownModel as exc:  # removed while this request was being rendered
            raise APIError(404, str(exc), "model", "model_not_found") from exc
        return _response(policy, req, messages, tools, prompt_ids, completions, version, route.adapter_id)

    return app


async def _sample_unless_gone(scheduler: BatchScheduler, request: Request, prompt_ids, params, adapter):
    """The request's completions; if its client disconnects first, the scheduler drops its rows."""
    sampling = asyncio.ensure_future(scheduler.submit(prompt_ids, params, adapter=adapter))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({sampling, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not sampling.done():  # the client left (or this handler was cancelled): withdraw the request
            sampling.cancel()
    if not sampling.done() or sampling.cancelled():
        raise APIError(499, "the client closed the connection before the completion was ready", code="client_closed")
    try:
        return sampling.result()
    except Exception as exc:  # this request's own failure; requests batched with it were answered
        log.error("sampling failed: %s: %s", type(exc).__name__, exc)
        raise APIError(500, f"sampling failed: {type(exc).__name__}: {exc}", kind="server_error") from exc


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone. The body is already read, so the next ASGI message the
    server sends this request is `http.disconnect` (or none, until the response is complete)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _extras(c: Completion, prompt_ids, version, adapter_id, temperature) -> dict[str, Any]:
    """grooves' fields on a choice (on a streamed choice's final chunk)."""
    return {
        "token_ids": c.token_ids, "prompt_token_ids": prompt_ids, "sampled_logprobs": c.logprobs,
        "adapter_version": version, "adapter_id": adapter_id, "temperature": temperature,
    }


def _usage(prompt_ids, completions) -> dict[str, int]:
    completion_tokens = sum(len(c.token_ids) for c in completions)
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens, "total_tokens": len(prompt_ids) + completion_tokens}


def _response(policy, req: ChatRequest, messages, tools, prompt_ids, completions, version, adapter_id=None) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(completions):
        parsed = policy.parse(c.text, tools)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        policy.remember(messages, tools, message, prompt_ids, c)
        finish = "tool_calls" if parsed.tool_calls else c.finish_reason
        logprobs = _logprobs_block(policy.tokenizer, c.token_ids, c.logprobs, c.top_logprobs) if req.logprobs else None
        choices.append(
            {"index": i, "message": message, "finish_reason": finish, "logprobs": logprobs}
            | _extras(c, prompt_ids, version, adapter_id, req.temperature)
        )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
        "usage": _usage(prompt_ids, completions),
    }


def _stream(policy, scheduler: BatchScheduler, adapters: AdapterTable, req: ChatRequest, messages, tools, prompt_ids, params):
    """The request as server-sent events (`serve.streaming`). The client leaving cancels the
    generator, which withdraws the request: the sampler drops its rows at the next decode step."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    params.on_tokens = forward_events(loop, queue)
    include_usage = bool((req.stream_options or {}).get("include_usage"))
    writer = ChunkWriter(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), req.model, include_usage)
    syntax = policy.tool_format.syntax
    choices = [
        ChoiceStream(i, policy.tokenizer, policy.eos_token_ids, req.stop or [], syntax, tools, bool(req.logprobs)) for i in range(req.n)
    ]

    async def events():
        sampling = None
        try:
            with adapters.lease(req.model) as route:
                version = adapters.version_of(route)
                sampling = asyncio.ensure_future(scheduler.submit(prompt_ids, params, adapter=route.adapter_id))
                sampling.add_done_callback(lambda _: queue.put_nowait(None))
                yield writer.chunk([c.first() for c in choices])
                while (step := await queue.get()) is not None:
                    deltas = []
                    for event in step:
                        choice = choices[event.index]
                        deltas += choice.token(event)
                        if event.completion is not None:
                            extras = _extras(event.completion, prompt_ids, version, route.adapter_id, req.temperature)
                            deltas += choice.finish(event.completion, extras)[0]
                            policy.parse(event.completion.text, tools)  # counted and logged as an unstreamed answer is
                            policy.remember(messages, tools, choice.message(), prompt_ids, event.completion)
                    if deltas:
                        yield writer.chunks(deltas)
                try:
                    completions = sampling.result()
                except Exception as exc:  # headers are out: the error goes in the stream, as OpenAI sends it
                    log.error("sampling failed: %s: %s", type(exc).__name__, exc)
                    yield sse(_error_body(f"sampling failed: {type(exc).__name__}: {exc}", kind="server_error"))
                    return
                if include_usage:
                    yield writer.usage(_usage(prompt_ids, completions))
                yield sse("[DONE]")
        except UnknownModel as exc:  # removed after the request was checked
            yield sse(_error_body(str(exc), param="model", code="model_not_found"))
        finally:
            if sampling is not None and not sampling.done():  # the client left: withdraw the request
                sampling.cancel()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-cache"})


def inprocess_client(policy_or_app, *, api_key: str = "grooves", timeout: float = 600.0):
    """An `openai.AsyncOpenAI` client wired to the app in this process (no sockets)."""
    import httpx
    from openai import AsyncOpenAI

    # the trainer's own requests: its run file bounds them, so no per-request work cap
    app = policy_or_app if isinstance(policy_or_app, FastAPI) else create_app(policy_or_app, max_request_tokens=None)
    transport = httpx.ASGITransport(app=app)
    http = httpx.AsyncClient(transport=transport, base_url="http://grooves.local", timeout=timeout)
    return AsyncOpenAI(base_url="http://grooves.local/v1", api_key=api_key, http_client=http, max_retries=0)


def serve(
    policy,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_n: int = 64,
    adapters: AdapterTable | None = None,
    admin: bool = False,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_request_tokens: int | None = MAX_REQUEST_TOKENS,
    api_key: str | None = None,
) -> None:
    import uvicorn

    app = create_app(
        policy, max_n=max_n, adapters=adapters, admin=admin, max_body_bytes=max_body_bytes, max_request_tokens=max_request_tokens,
        api_key=api_key,
    )
    uvicorn.run(app, host=host, port=port, log_level="info")
