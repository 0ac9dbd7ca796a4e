"""The chat completions endpoints: `/v1/models`, `/v1/models/{id}`, `/v1/chat/completions`, `/health`.

A request is checked (model, limits, content parts, tools, every field against the compatibility
table of `serve.compat`), its prompt rendered by the policy on a worker thread (a long prompt does
not stall the event loop), its `response_format` / `tool_choice` compiled into a grammar
(`policy.constraints`), and it is sampled through the app's `BatchScheduler` with the adapter its
`model` names, answered whole or streamed (`serve.streaming`). A failure while sampling fails only
this request (a JSON 500 that leaves the connection open); a request whose client disconnects is
withdrawn from the sampler at its next decode step.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

import jsonschema
from fastapi import APIRouter, Request

from grooves.policy.base import ContextOverflow, Policy
from grooves.policy.batching import BatchScheduler
from grooves.policy.constraints import ConstraintError
from grooves.policy.logits import LOGIT_BIAS_RANGE
from grooves.policy.sampling import Completion, SamplingParams
from grooves.serve import compat
from grooves.serve.errors import APIError
from grooves.serve.routing import AdapterTable, UnknownModel
from grooves.serve.schemas import ChatRequest, Message, choice_body, completion_body, logprobs_block
from grooves.serve.streaming import stream_completion

log = logging.getLogger("grooves.server")

_FN_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def chat_router(
    policy: Policy,
    scheduler: BatchScheduler,
    adapters: AdapterTable,
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
        data = [
            {"id": r.name, "object": "model", "owned_by": "grooves", "created": 0}
            | ({"parent": policy.served_name, "root": r.path} if r.name != policy.served_name else {})
            for r in adapters.routes()
        ]
        return {"object": "list", "data": data}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        for entry in (await models())["data"]:
            if entry["id"] == model_id:
                return entry
        raise APIError(
            404,
            f"model {model_id!r} is not served here; available: {adapters.names()}",
            "model",
            "model_not_found",
        )

    @router.get("/health")
    async def health():
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
            "tool_calls": {"parsed": calls.parsed, "unparsed": calls.unparsed},
        }

    @router.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        if req.model not in adapters.names():
            raise APIError(
                404,
                f"model {req.model!r} is not served here; available: {adapters.names()}",
                "model",
                "model_not_found",
            )
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
        check_content(req.messages)
        validate_tools(req.tools)
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        tools = req.tools if req.tool_choice != "none" else None

        def render() -> list[int]:  # tokenizing a long prompt takes a while: not on the event loop
            ids = policy.prompts.render(messages, tools)
            policy.prompts.check_fits(ids, max_tokens)
            return ids

        try:
            prompt_ids = await asyncio.to_thread(render)
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
        if req.stream:
            return stream_completion(policy, scheduler, adapters, req, messages, tools, prompt_ids, params)
        try:
            with adapters.lease(
                req.model
            ) as route:  # the adapter stays loaded until this request is answered
                version = adapters.version_of(route)
                completions = await _sample_unless_gone(
                    scheduler, request, prompt_ids, params, route.adapter_id
                )
        except UnknownModel as exc:  # removed while this request was being rendered
            raise APIError(404, str(exc), "model", "model_not_found") from exc
        if meter is not None:
            meter(req.model, len(prompt_ids), sum(len(c.token_ids) for c in completions))
        return _response(policy, req, messages, tools, prompt_ids, completions, version, route.adapter_id)

    return router


def validate_tools(tools: list[dict[str, Any]] | None) -> None:
    """OpenAI function tools: a name matching [a-zA-Z0-9_-]{1,64} and a JSON-schema `parameters`."""
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise APIError(400, f"{where}: expected {{'type': 'function', 'function': {{...}}}}", param=where)
        fn = tool["function"]
        if not isinstance(fn.get("name"), str) or not _FN_NAME.match(fn["name"]):
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


def check_content(messages: list[Message]) -> None:
    """Only text reaches a text model: an image, audio or file part is refused, not silently dropped."""
    for i, m in enumerate(messages):
        if not isinstance(m.content, list):
            continue
        for j, part in enumerate(m.content):
            where = f"messages[{i}].content[{j}]"
            if part.get("type") != "text":
                raise APIError(
                    400,
                    f"{where}.type is {part.get('type')!r}: this server serves a text-only model and takes "
                    "only {'type': 'text', 'text': '...'} parts",
                    f"{where}.type",
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
            raise APIError(
                400,
                f"stream_options.{unknown[0]} is not supported; only include_usage is",
                f"stream_options.{unknown[0]}",
            )
        if not isinstance(req.stream_options.get("include_usage", False), bool):
            raise APIError(
                400, "stream_options.include_usage must be true or false", "stream_options.include_usage"
            )
    if req.parallel_tool_calls is False and req.tools and req.tool_choice in (None, "auto"):
        raise APIError(
            400,
            "parallel_tool_calls: false is only enforced with a forced tool_choice ('required' or a named "
            "function); with 'auto' the model may write several calls",
            "parallel_tool_calls",
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
    """The grammar `response_format` / `tool_choice` impose (None: none); 400 naming the field it cannot enforce."""
    wants = (req.response_format or {}).get("type", "text") != "text" or req.tool_choice not in (
        None,
        "auto",
        "none",
    )
    if not wants:
        return None
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


async def _sample_unless_gone(scheduler: BatchScheduler, request: Request, prompt_ids, params, adapter):
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
        log.error("sampling failed: %s: %s", type(exc).__name__, exc)
        raise APIError(500, f"sampling failed: {type(exc).__name__}: {exc}", kind="server_error") from exc


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone. The body is already read, so the next ASGI message the
    server sends this request is `http.disconnect` (or none, until the response is complete)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


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
        parsed = policy.prompts.parse(c.text, tools)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        policy.prompts.remember(messages, tools, message, prompt_ids, c)
        finish = "tool_calls" if parsed.tool_calls else c.finish_reason
        block = (
            logprobs_block(policy.tokenizer, c.token_ids, c.logprobs, c.top_logprobs)
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
    return completion_body(req.model, choices, len(prompt_ids), sum(len(c.token_ids) for c in completions))
