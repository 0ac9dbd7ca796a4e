"""`POST /v1/responses`: OpenAI's Responses API over the request pipeline the chat route uses.

A request is checked against its compatibility table (`serve.responses.fields`), read as a chat
request (`serve.responses.input`), prepared by the pipeline's `prepare` as a chat request is
(`serve.pipeline`: rendering with token continuity, tool checks, the `text.format` /
`tool_choice` grammars) and sampled through the app's `BatchScheduler` with the adapter its
`model` names; it is answered as a `response` object or streamed as Responses events
(`serve.responses.stream`). One request is one sample.

The output is a `message` item with one `output_text` part (when the sample holds text) and a
`function_call` item per call, in that order. The response also carries grooves' token record at
its top level, as a chat choice does: `token_ids`, `prompt_token_ids`, `sampled_logprobs`,
`adapter_version`, `adapter_id`, `temperature` (the `openai` client keeps them as extra
attributes). Each answered turn is remembered with its token ids, so the next request that sends
it back (as items, or by `previous_response_id`) continues those exact ids.

`previous_response_id` names a response this server answered with `store` true: its messages
(input and output, without its instructions) come before the new input. They are kept in memory,
the last `MAX_STORED_RESPONSES`, each under the API key (tenant) that made it; an id not among
them, or kept for another key, is the same 400 naming the field.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from fastapi import APIRouter, Request
from pydantic import ValidationError

from grooves.policy.base import Policy
from grooves.policy.batching import BatchScheduler
from grooves.serve import compat
from grooves.serve.closed import request_error
from grooves.serve.errors import APIError
from grooves.serve.keys import caller
from grooves.serve.pipeline import prepare, read_request, require_served, sample_unless_gone
from grooves.serve.responses.fields import INCLUDABLE, RESPONSES_FIELDS
from grooves.serve.responses.input import as_chat_request, renamed
from grooves.serve.responses.request import ResponsesRequest
from grooves.serve.responses.stream import stream_response
from grooves.serve.responses.turn import ResponseStore, Turn
from grooves.serve.routing import ModelRoutes, UnknownModel
from grooves.serve.schemas import log_answer

DEFAULT_MAX_OUTPUT_TOKENS = 256


def responses_router(
    policy: Policy,
    scheduler: BatchScheduler,
    adapters: ModelRoutes,
    *,
    max_request_tokens: int | None,
    meter: Callable[[str, int, int], None] | None = None,
) -> APIRouter:
    """`POST /v1/responses` over `policy`, sampling through `scheduler`, routing names with `adapters`."""
    router = APIRouter()
    store = ResponseStore()

    @router.post(
        "/v1/responses",
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {}}}},
    )
    async def responses(request: Request):
        req = await asyncio.to_thread(read_responses_request, await request.body())
        require_served(req.model, adapters)
        check_fields(req)
        max_tokens = req.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS
        if max_request_tokens is not None and max_tokens > max_request_tokens:
            raise APIError(
                400,
                f"max_output_tokens = {max_tokens} is more than this server's limit of {max_request_tokens} per "
                "request; lower it",
                "max_output_tokens",
            )
        tenant = caller()
        history = store.get(tenant, req.previous_response_id) if req.previous_response_id else []
        try:
            chat = as_chat_request(req, history)
            messages, tools, prompt_ids, params = await asyncio.to_thread(prepare, policy, chat, max_tokens)
        except APIError as exc:
            raise renamed(exc) from exc
        turn = Turn(req, chat, messages, tools, prompt_ids, store if req.store is not False else None, tenant)
        if req.stream:
            return stream_response(policy, scheduler, adapters, turn, params)
        try:
            with adapters.lease(req.model) as route:
                version = adapters.version_of(route)
                completions = await sample_unless_gone(
                    scheduler, request, prompt_ids, params, route.adapter_id
                )
        except UnknownModel as exc:
            raise APIError(404, str(exc), "model", "model_not_found") from exc
        completion = completions[0]
        body = await asyncio.to_thread(turn.answer, policy, completion, version, route.adapter_id)
        if meter is not None:
            meter(req.model, len(prompt_ids), len(completion.token_ids))
        log_answer(chat, len(prompt_ids), [(completion, completion.finish_reason)])
        return body

    return router


def read_responses_request(body: bytes) -> ResponsesRequest:
    """The request body as a `ResponsesRequest`; a 400 naming the field's path (`serve.closed.request_error`)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        read_request(body)  # the chat route's 400 for a body that is not JSON (the model is read below)
        raise
    try:
        return ResponsesRequest.model_validate(data)
    except ValidationError as exc:
        raise request_error(exc) from None


def check_fields(req: ResponsesRequest) -> None:
    """Every field the request sent is one this server implements, at a value it implements."""
    sent = {name: getattr(req, name) for name in req.model_fields_set} | dict(req.model_extra or {})
    try:
        compat.check_fields(sent, RESPONSES_FIELDS, "Responses")
    except compat.FieldRefused as exc:
        raise APIError(400, str(exc), exc.param) from exc
    for value in req.include or []:
        if value not in INCLUDABLE:
            raise APIError(
                400,
                f"include {value!r} is not supported; this server can include {list(INCLUDABLE)}",
                "include",
            )
