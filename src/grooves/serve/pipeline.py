"""The request pipeline the three sampling routes share: chat completions (`serve.chat`), the
Responses API (`serve.responses`) and token-in, token-out generation (`serve.generate`).

Each route reads its body with `read_request` (parsing and validating on a worker thread; a body
that is not JSON is the same 400 on every route), answers a model it does not serve with a 404
(`require_served`), and samples through the app's `BatchScheduler` with `sample_unless_gone`: a
request whose client disconnects is withdrawn from the sampler at its next decode step, and a
failure while sampling fails only this request (a JSON 500 that leaves the connection open; a
grammar that reaches a limit while sampling is the request's fault, a 400 naming the field). The
two chat-shaped routes turn a checked request into prompt ids and sampling parameters with
`prepare`: its tool schemas checked, its messages rendered by the policy, its `logit_bias` read
against the vocabulary (`vocab_size`), its `response_format` / `tool_choice` /
`parallel_tool_calls` compiled into a grammar (`policy.constraints`). Each of those steps grows with
the request, so `prepare` runs on a worker thread, never on the event loop. What is one route's
own (the fields it implements, the shape of its answer) stays in that route's module.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import jsonschema
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from grooves.policy.base import ContextOverflow, Policy
from grooves.policy.batching import BatchScheduler
from grooves.policy.constraints import ConstraintError
from grooves.policy.logits import LOGIT_BIAS_RANGE
from grooves.policy.sampling import SamplingParams
from grooves.serve.closed import request_error
from grooves.serve.errors import APIError, sampling_error
from grooves.serve.routing import ModelRoutes
from grooves.serve.schemas import ChatRequest

_FN_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def read_request(body: bytes) -> ChatRequest:
    """The request body as a `ChatRequest`; a 400 naming the field's path (`serve.closed.request_error`)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # not JSON, bytes that are no text, nesting past the stack
        error = getattr(exc, "msg", None) or (
            "nested too deeply" if isinstance(exc, RecursionError) else "not UTF-8, UTF-16 or UTF-32 text"
        )
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", getattr(exc, "pos", 0)),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": error},
                }
            ]
        ) from None
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        raise request_error(exc) from None


def not_served(model: str, adapters: ModelRoutes) -> APIError:
    """The 404 for a request that names a model this server does not serve."""
    return APIError(
        404, f"model {model!r} is not served here; available: {adapters.names()}", "model", "model_not_found"
    )


def require_served(model: str, adapters: ModelRoutes) -> None:
    """A 404 (`not_served`) unless `adapters` routes `model`."""
    if model not in adapters.names():
        raise not_served(model, adapters)


def prepare(policy: Policy, req: ChatRequest, max_tokens: int):
    """(messages, tools, prompt ids, sampling params) of a checked request; on a worker thread, since
    each step grows with the request: checking its tool schemas, rendering, compiling its grammar."""
    validate_tools(req.tools)
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    tools = req.tools if req.tool_choice != "none" else None
    try:
        prompt_ids = policy.prompts.render(messages, tools)
        policy.prompts.check_fits(prompt_ids, max_tokens)
    except ContextOverflow as exc:
        raise APIError(400, str(exc), "messages", "context_length_exceeded") from exc
    except (KeyError, TypeError, ValueError) as exc:  # a message the chat template cannot render
        raise APIError(
            400, f"messages could not be rendered by the chat template: {exc}", "messages"
        ) from exc
    params = SamplingParams(
        n=req.n,
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        stop=req.stop or [],
        seed=req.seed,
        logit_bias=logit_bias_of(req, vocab_size(policy)),
        frequency_penalty=req.frequency_penalty or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        top_logprobs=req.top_logprobs or 0,
        constraint=constraint_of(policy, req, tools),
    )
    return messages, tools, prompt_ids, params


def validate_tools(tools: list[dict[str, Any]] | None) -> None:
    """OpenAI function tools (their shape checked by `schemas.Tool`): a name matching
    [a-zA-Z0-9_-]{1,64} and a JSON-schema `parameters`."""
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        fn = tool["function"]
        if not _FN_NAME.match(fn["name"]):
            raise APIError(
                400, f"{where}.function.name must match [a-zA-Z0-9_-]{{1,64}}", param=f"{where}.function.name"
            )
        params = fn.get("parameters", {"type": "object", "properties": {}})
        try:
            jsonschema.Draft202012Validator.check_schema(params)
        except jsonschema.SchemaError as exc:
            raise APIError(
                400,
                f"{where}.function.parameters is not a valid JSON schema: {exc.message}",
                param=f"{where}.function.parameters",
            ) from exc
        if (
            not isinstance(params, dict) or params.get("type", "object") != "object"
        ):  # `true` is a valid schema too
            raise APIError(
                400,
                f"{where}.function.parameters must be an object schema",
                param=f"{where}.function.parameters",
            )


def vocab_size(policy: Policy) -> int:
    """The token ids a request may name: the model's vocabulary, or the tokenizer's where the policy
    holds no model of its own (a vLLM policy that only samples keeps its weights in the engine)."""
    model = getattr(policy, "model", None)
    return int(model.config.vocab_size) if model is not None else len(policy.tokenizer)


def logit_bias_of(req: ChatRequest, vocab_size: int) -> dict[int, float]:
    """The request's logit_bias as token id -> value, checked (400 naming `logit_bias`)."""
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        if not key.lstrip("-").isdigit() or not 0 <= int(key) < vocab_size:
            raise APIError(
                400,
                f"logit_bias key {key!r} is not a token id of this model (0 .. {vocab_size - 1})",
                "logit_bias",
            )
        if not LOGIT_BIAS_RANGE[0] <= value <= LOGIT_BIAS_RANGE[1]:
            raise APIError(
                400, f"logit_bias[{key!r}] = {value} is outside {list(LOGIT_BIAS_RANGE)}", "logit_bias"
            )
        bias[int(key)] = float(value)
    return bias


def constraint_of(policy: Policy, req: ChatRequest, tools):
    """The grammar `response_format` / `tool_choice` / `parallel_tool_calls` impose (None: none); 400
    naming the field it cannot enforce."""
    try:
        return policy.prompts.constraint_for(
            response_format=req.response_format,
            tools=tools,
            tool_choice=req.tool_choice,
            parallel_tool_calls=req.parallel_tool_calls is not False,
        )
    except ConstraintError as exc:
        raise APIError(400, str(exc), exc.param) from exc


def _read_outcome(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


async def sample_unless_gone(scheduler: BatchScheduler, request: Request, prompt_ids, params, adapter):
    """The request's completions; if its client disconnects first, the scheduler drops its rows."""
    sampling = asyncio.ensure_future(scheduler.submit(prompt_ids, params, adapter=adapter))
    # if this handler is cancelled, the sampling may still end with an error (the sampler closing
    # under a Ctrl-C); it is read here, so asyncio never prints it as an exception nobody retrieved
    sampling.add_done_callback(_read_outcome)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({sampling, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not sampling.done():  # the client left (or this handler was cancelled): withdraw the request
            sampling.cancel()
    if not sampling.done() or sampling.cancelled():
        raise APIError(
            499, "the client closed the connection before the completion was ready", code="client_closed"
        )
    try:
        return sampling.result()
    except Exception as exc:  # this request's own failure; requests batched with it were answered
        raise sampling_error(exc) from exc


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone. The body is already read, so the next ASGI message the
    server sends this request is `http.disconnect` (or none, until the response is complete)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
