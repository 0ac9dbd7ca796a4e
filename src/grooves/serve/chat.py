"""The chat completions endpoints: `/v1/models`, `/v1/models/{id}`, `/v1/chat/completions`, `/health`.

A request is checked (model, limits, content parts, tools, every field against the compatibility
table of `serve.compat`), then prepared and sampled by the request pipeline the sampling routes
share (`serve.pipeline`): its prompt rendered by the policy, its `response_format` / `tool_choice`
/ `parallel_tool_calls` compiled into a grammar (`policy.constraints`), and it is sampled through
the app's `BatchScheduler` with the adapter its `model` names, answered whole or streamed
(`serve.streaming`). Everything whose cost grows with the request runs on a worker thread, never
on the event loop, so one large request does not stall the others (`/v1/models` answers while
it runs): reading the body's JSON and validating it (200,000 messages: seconds), checking tool
schemas, rendering, compiling a grammar (5,000 properties: seconds), and building the answer. A
failure while sampling fails only this request (a JSON 500 that leaves the connection open; a
grammar that reaches a limit while sampling is the request's fault, a 400 naming the field); a
request whose client disconnects is withdrawn from the sampler at its next decode step. Each
answered request is logged on the `grooves.server` logger with its `user`, when it sends one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request

from grooves.policy.base import Policy
from grooves.policy.batching import BatchScheduler
from grooves.policy.sampling import Completion
from grooves.serve import compat
from grooves.serve.errors import APIError
from grooves.serve.pipeline import not_served, prepare, read_request, require_served, sample_unless_gone
from grooves.serve.routing import ModelRoutes, UnknownModel
from grooves.serve.schemas import (
    ChatRequest,
    choice_body,
    completion_body,
    log_answer,
    logprobs_block,
    with_special_tokens,
)
from grooves.serve.streaming import stream_completion

log = logging.getLogger("grooves.server")


def chat_router(
    policy: Policy,
    scheduler: BatchScheduler,
    adapters: ModelRoutes,
    *,
    max_n: int,
    max_request_tokens: int | None,
    meter: Callable[[str, int, int], None] | None = None,
) -> APIRouter:
    """The two endpoints over `policy`, sampling through `scheduler`, routing names with `adapters`;
    `meter(model, prompt_tokens, completion_tokens)` counts each answered completion request."""
    router = APIRouter()

    @router.get("/v1/models")
    async def models():
        return models_body(policy, adapters)

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        for entry in models_body(policy, adapters)["data"]:
            if entry["id"] == model_id:
                return entry
        raise not_served(model_id, adapters)

    @router.get("/health")
    async def health():
        return health_body(policy, scheduler, adapters)

    @router.post(
        "/v1/chat/completions",
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {}}}},
    )
    async def chat(request: Request):
        # the body is read here, parsed and validated on a worker thread (`read_request`)
        req = await asyncio.to_thread(read_request, await request.body())
        max_tokens = check_request(req, adapters, max_n=max_n, max_request_tokens=max_request_tokens)
        prepared = await asyncio.to_thread(prepare, policy, req, max_tokens)
        if req.stream:
            return stream_completion(policy, scheduler, adapters, req, *prepared)
        return await _answer(policy, scheduler, adapters, request, req, prepared, meter)

    return router


def models_body(policy: Policy, adapters: ModelRoutes) -> dict[str, Any]:
    """`/v1/models`: the base model and each named adapter (with its `parent` and `root` path)."""
    data = [
        {"id": r.name, "object": "model", "owned_by": "grooves", "created": 0}
        | ({"parent": policy.served_name, "root": r.path} if r.name != policy.served_name else {})
        for r in adapters.routes()
    ]
    return {"object": "list", "data": data}


def health_body(policy: Policy, scheduler: BatchScheduler, adapters: ModelRoutes) -> dict[str, Any]:
    """`/health`: the models served, the adapter version, the sampler's and tool-call parser's counters."""
    counters, calls = scheduler.counters, policy.prompts.tool_calls
    return {
        "status": "ok",
        "models": adapters.names(),
        "adapter_version": policy.adapters.version,
        "sampler": {
            "batches": counters.batches,
            "failed_requests": counters.failed_requests,
            "cancelled_requests": counters.cancelled_requests,
        },
        "tool_calls": {"parsed": calls.parsed, "unparsed": calls.unparsed, "cut": calls.cut},
    }


def check_request(
    req: ChatRequest, adapters: ModelRoutes, *, max_n: int, max_request_tokens: int | None
) -> int:
    """The request's max_tokens (256 unless it asks); a 404 for a model not served, a 400 for a field
    this server does not implement or a request past the server's `max_n` / `max_request_tokens`."""
    require_served(req.model, adapters)
    check_fields(req)
    if req.n > max_n:
        raise APIError(400, f"n={req.n} is larger than this server's limit of {max_n}", "n")
    max_tokens = req.max_completion_tokens or req.max_tokens or 256
    if max_request_tokens is not None and req.n * max_tokens > max_request_tokens:
        name = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        raise APIError(
            400,
            f"n x {name} = {req.n} x {max_tokens} = {req.n * max_tokens} tokens is more than this server's "
            f"limit of {max_request_tokens} per request; lower n or {name}",
            name,
        )
    return max_tokens


async def _answer(
    policy: Policy,
    scheduler: BatchScheduler,
    adapters: ModelRoutes,
    request: Request,
    req: ChatRequest,
    prepared: tuple,
    meter: Callable[[str, int, int], None] | None,
) -> dict[str, Any]:
    """The whole chat completion of a prepared request (`prepare`'s messages, tools, prompt ids and
    params), sampled with the adapter its `model` names, metered and logged."""
    messages, tools, prompt_ids, params = prepared
    try:
        with adapters.lease(req.model) as route:  # the adapter stays loaded until this request is answered
            version = adapters.version_of(route)
            completions = await sample_unless_gone(scheduler, request, prompt_ids, params, route.adapter_id)
    except UnknownModel as exc:  # removed while this request was being rendered
        raise APIError(404, str(exc), "model", "model_not_found") from exc
    body = await asyncio.to_thread(
        _response, policy, req, messages, tools, prompt_ids, completions, version, route.adapter_id
    )
    if meter is not None:
        meter(req.model, len(prompt_ids), sum(len(c.token_ids) for c in completions))
    log_answer(
        req,
        len(prompt_ids),
        [(c, ch["finish_reason"]) for c, ch in zip(completions, body["choices"], strict=True)],
    )
    return body


def check_fields(req: ChatRequest) -> None:
    """Every field the request sent is one this server implements (`serve.compat`), used consistently."""
    sent = {name: getattr(req, name) for name in req.model_fields_set} | dict(req.model_extra or {})
    try:
        compat.check_fields(sent)
    except compat.FieldRefused as exc:
        raise APIError(400, str(exc), exc.param) from exc
    if req.skip_special_tokens is False and req.stream:
        raise APIError(
            400, "skip_special_tokens: false is supported on unstreamed requests only", "skip_special_tokens"
        )
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    if req.stream_options is not None:
        if not req.stream:
            raise APIError(400, "stream_options is only allowed with stream: true", "stream_options")
        unknown = sorted(set(req.stream_options) - {"include_usage"})
        if unknown:
            raise APIError(
                400,
                f"stream_options.{unknown[0]} is not supported; only include_usage is",
                f"stream_options.{unknown[0]}",
            )
        if not isinstance(req.stream_options.get("include_usage", False), bool):
            raise APIError(
                400, "stream_options.include_usage must be true or false", "stream_options.include_usage"
            )


def _response(
    policy: Policy,
    req: ChatRequest,
    messages,
    tools,
    prompt_ids: list[int],
    completions: list[Completion],
    version: int | None,
    adapter_id: str | None = None,
) -> dict[str, Any]:
    """The chat completion: each sample parsed into a message (tool calls included) and remembered
    with its token ids, so a later turn of the conversation continues them exactly."""
    choices = []
    for i, c in enumerate(completions):
        if req.skip_special_tokens is False:
            c = with_special_tokens(policy.tokenizer, policy.prompts.eos_token_ids, c, req.stop or [])
        cut = c.finish_reason == "length"  # a call cut at max_tokens is returned as a call, never as text
        parsed = policy.prompts.parse(c.text, tools, cut=cut)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        policy.prompts.remember(messages, tools, message, prompt_ids, c)
        finish = "tool_calls" if parsed.tool_calls and not cut else c.finish_reason
        block = (
            logprobs_block(
                policy.tokenizer,
                c.token_ids,
                c.logprobs,
                c.top_logprobs,
                as_ids=bool(req.return_tokens_as_token_ids),
            )
            if req.logprobs
            else None
        )
        choices.append(
            choice_body(
                i,
                message,
                finish,
                c,
                prompt_ids,
                logprobs=block,
                adapter_version=version,
                adapter_id=adapter_id,
                temperature=req.temperature,
            )
        )
    body = completion_body(req.model, choices, len(prompt_ids), sum(len(c.token_ids) for c in completions))
    if req.return_token_ids:  # where vLLM puts them
        body["prompt_token_ids"] = prompt_ids
    return body
