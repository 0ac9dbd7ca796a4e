"""`POST /inference/v1/generate`: token ids in, token ids and logprobs out, in vLLM's shape.

A client that renders its own prompts (verifiers' `TrainClient` through the `renderers` package,
prime-rl, any trainer with its own chat templates) sends the exact prompt ids and gets exactly
those ids continued: nothing is rendered, parsed or re-tokenized here. The request is vLLM's
`GenerateRequest`:

    {"model": "...", "token_ids": [...], "sampling_params": {"max_tokens": 64, "temperature": 1.0,
     "logprobs": 1, "stop_token_ids": [...], ...}}

and the answer vLLM's, with grooves' adapter fields beside it:

    {"request_id", "model", "created", "prompt_token_ids": [...], "usage": {...},
     "choices": [{"index", "token_ids", "finish_reason", "stop_reason",
                  "logprobs": {"content": [{"token": "token_id:17", "token_id": 17, "logprob", "top_logprobs"}]},
                  "text"?, "adapter_version", "adapter_id"}]}

Each logprob entry names its token both ways vLLM does (`token: "token_id:N"`, as with
`return_tokens_as_token_ids`, and `token_id`). Sampling runs through the app's `BatchScheduler`
with the adapter `model` names (on the training service: a trainable model's live adapter), so
a choice's `adapter_version` says which training step's weights sampled it.

`sampling_params` takes vLLM's names. Those grooves samples with: `n`, `max_tokens` (default
256), `temperature`, `top_p`, `seed`, `stop`, `stop_token_ids` (the model's end-of-turn ids,
which always stop a sample, as vLLM's eos does), `logprobs` (the alternatives per token, 1 to
20; 0: the sampled token's own entry as its one top entry, as vLLM; null: no logprobs),
`presence_penalty`, `frequency_penalty`, `logit_bias`, `skip_special_tokens` and `detokenize`
(for `output_mode: "text"`). The others are accepted at
their vLLM default (`top_k: -1`, `min_p: 0`, `repetition_penalty: 1`, `ignore_eos: false`, ...)
and are a 400 naming `sampling_params.<name>` at any other value, as is a field vLLM does not have.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from grooves.policy.base import Policy
from grooves.policy.batching import BatchScheduler
from grooves.policy.logits import LOGIT_BIAS_RANGE, PENALTY_RANGE
from grooves.policy.sampling import MAX_TOP_LOGPROBS, SEED_MAX, SEED_MIN, Completion, SamplingParams
from grooves.serve.closed import request_error
from grooves.serve.errors import APIError
from grooves.serve.pipeline import read_request, require_served, sample_unless_gone, vocab_size
from grooves.serve.routing import ModelRoutes, UnknownModel
from grooves.serve.schemas import StrictFloat

DEFAULT_MAX_TOKENS = 256

INERT_SAMPLING: dict[str, tuple[Any, ...]] = {
    "top_k": (None, -1, 0),
    "min_p": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "min_tokens": (None, 0),
    "ignore_eos": (None, False),
    "include_stop_str_in_output": (None, False),
    "spaces_between_special_tokens": (None, True),
    "prompt_logprobs": (None,),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "structured_outputs": (None,),
    "guided_decoding": (None,),
    "truncate_prompt_tokens": (None,),
    "output_kind": (None,),
    "logits_processors": (None,),
    "extra_args": (None, {}),
    "best_of": (None, 1),
    "flat_logprobs": (None, False),
}
"""vLLM sampling parameters grooves does not implement: accepted only at their default (no effect)."""

INERT_REQUEST: dict[str, tuple[Any, ...]] = {
    "features": (None,),
    "content_parts": (None, []),
    "kv_transfer_params": (None,),
    "ec_transfer_params": (None,),
    "reasoning_ended": (None,),
    "reasoning_parser_kwargs": (None,),
    "priority": (None, 0),
    "token_offsets": (None,),
    "stream_options": (None,),
}
"""vLLM request fields grooves does not implement (multimodal inputs, disaggregated serving, priorities)."""


class GenerateSampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    n: StrictInt = Field(default=1, ge=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0)
    seed: StrictInt | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    presence_penalty: StrictFloat = Field(default=0.0, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    frequency_penalty: StrictFloat = Field(default=0.0, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    logit_bias: dict[str, StrictFloat] | None = None
    skip_special_tokens: StrictBool = True
    detokenize: StrictBool = True


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    token_ids: list[StrictInt] = Field(min_length=1)
    sampling_params: GenerateSampling = Field(default_factory=GenerateSampling)
    request_id: StrictStr | None = None
    output_mode: str = "tokens"
    return_token_ids: StrictBool | None = None
    stream: StrictBool | None = False
    cache_salt: StrictStr | None = None
    """vLLM's prefix-cache salt: grooves keeps no cache across requests, so there is nothing to salt."""


def generate_router(
    policy: Policy,
    scheduler: BatchScheduler,
    adapters: ModelRoutes,
    *,
    max_n: int,
    max_request_tokens: int | None,
    meter: Callable[[str, int, int], None] | None = None,
) -> APIRouter:
    """`POST /inference/v1/generate` over `policy`, sampling through `scheduler`, routing `model` with `adapters`."""
    router = APIRouter()

    @router.post(
        "/inference/v1/generate",
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {}}}},
    )
    async def generate(request: Request):
        req = await asyncio.to_thread(read_generate_request, await request.body())
        model = req.model or policy.served_name
        require_served(model, adapters)
        params = sampling_params(req, policy, max_n=max_n, max_request_tokens=max_request_tokens)
        try:
            with adapters.lease(model) as route:
                version = adapters.version_of(route)
                completions = await sample_unless_gone(
                    scheduler, request, req.token_ids, params, route.adapter_id
                )
        except UnknownModel as exc:
            raise APIError(404, str(exc), "model", "model_not_found") from exc
        if meter is not None:
            meter(model, len(req.token_ids), sum(len(c.token_ids) for c in completions))
        return await asyncio.to_thread(
            answer, policy, req, model, completions, version=version, adapter_id=route.adapter_id
        )

    return router


def read_generate_request(body: bytes) -> GenerateRequest:
    """The body as a `GenerateRequest`; a 400 naming the field (`sampling_params.<name>` inside it)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        read_request(body)  # the chat route's 400 for a body that is not JSON
        raise
    try:
        req = GenerateRequest.model_validate(data)
    except ValidationError as exc:
        raise request_error(exc) from None
    _check_extras(req.model_extra or {}, INERT_REQUEST, "")
    _check_extras(req.sampling_params.model_extra or {}, INERT_SAMPLING, "sampling_params.")
    if req.stream:
        raise APIError(
            400, "stream: true is not supported on /inference/v1/generate; send stream: false", "stream"
        )
    if req.output_mode not in ("tokens", "text"):
        raise APIError(400, f"output_mode must be 'tokens' or 'text', not {req.output_mode!r}", "output_mode")
    if req.output_mode == "text" and not req.sampling_params.detokenize:
        raise APIError(400, "output_mode 'text' needs sampling_params.detokenize: true", "output_mode")
    return req


def _check_extras(extras: dict[str, Any], inert: dict[str, tuple[Any, ...]], prefix: str) -> None:
    for name, value in extras.items():
        if name not in inert:
            raise APIError(
                400,
                f"{prefix}{name} is not a field of vLLM's generate request this server knows; remove it",
                prefix + name,
            )
        if value not in inert[name]:
            raise APIError(
                400,
                f"{prefix}{name} = {value!r} is not supported by this server; leave it out or send its default "
                f"({inert[name][1] if len(inert[name]) > 1 else None!r})",
                prefix + name,
            )


def sampling_params(
    req: GenerateRequest, policy: Policy, *, max_n: int, max_request_tokens: int | None
) -> SamplingParams:
    """grooves' sampling parameters of a checked request (400 naming what it cannot honour)."""
    sp = req.sampling_params
    vocab = vocab_size(policy)
    bad = next((t for t in req.token_ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(
            400, f"token_ids holds {bad}, not a token id of this model (0 .. {vocab - 1})", "token_ids"
        )
    if sp.n > max_n:
        raise APIError(
            400,
            f"sampling_params.n={sp.n} is larger than this server's limit of {max_n}",
            "sampling_params.n",
        )
    max_tokens = sp.max_tokens or DEFAULT_MAX_TOKENS
    if max_request_tokens is not None and sp.n * max_tokens > max_request_tokens:
        raise APIError(
            400,
            f"n x max_tokens = {sp.n} x {max_tokens} = {sp.n * max_tokens} tokens is more than this server's limit "
            f"of {max_request_tokens} per request",
            "sampling_params.max_tokens",
        )
    if len(req.token_ids) + max_tokens > policy.prompts.max_context:
        raise APIError(
            400,
            f"token_ids has {len(req.token_ids)} tokens and max_tokens is {max_tokens}: together more than the "
            f"model's context of {policy.prompts.max_context}",
            "token_ids",
            "context_length_exceeded",
        )
    extra_stops = sorted(set(sp.stop_token_ids or []) - set(policy.prompts.eos_token_ids))
    if extra_stops:
        raise APIError(
            400,
            f"sampling_params.stop_token_ids {extra_stops} are not this model's end-of-turn ids "
            f"{sorted(policy.prompts.eos_token_ids)}, the only ids this server stops on",
            "sampling_params.stop_token_ids",
        )
    bias = {}
    for key, value in (sp.logit_bias or {}).items():
        if (
            not key.lstrip("-").isdigit()
            or not 0 <= int(key) < vocab
            or not LOGIT_BIAS_RANGE[0] <= value <= LOGIT_BIAS_RANGE[1]
        ):
            raise APIError(
                400,
                f"sampling_params.logit_bias[{key!r}] = {value} is not a token id and a value in {list(LOGIT_BIAS_RANGE)}",
                "sampling_params.logit_bias",
            )
        bias[int(key)] = float(value)
    return SamplingParams(
        n=sp.n,
        max_tokens=max_tokens,
        temperature=sp.temperature,
        top_p=sp.top_p,
        stop=[sp.stop] if isinstance(sp.stop, str) else list(sp.stop or []),
        seed=sp.seed,
        logit_bias=bias,
        frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty,
        top_logprobs=sp.logprobs or 0,
    )


def answer(
    policy: Policy,
    req: GenerateRequest,
    model: str,
    completions: list[Completion],
    *,
    version: int | None,
    adapter_id: str | None,
) -> dict[str, Any]:
    """vLLM's `GenerateResponse` of the samples, with grooves' adapter fields on each choice."""
    choices = []
    for i, c in enumerate(completions):
        choice: dict[str, Any] = {
            "index": i,
            "token_ids": c.token_ids,
            "finish_reason": c.finish_reason,
            "stop_reason": None,
            "logprobs": _logprobs(c, req.sampling_params.logprobs)
            if req.sampling_params.logprobs is not None
            else None,
            "adapter_version": version,
            "adapter_id": adapter_id,
        }
        if req.output_mode == "text":
            choice["text"] = _text(policy, c, req.sampling_params)
        choices.append(choice)
    completion_tokens = sum(len(c.token_ids) for c in completions)
    return {
        "request_id": req.request_id or f"gen-{uuid.uuid4().hex}",
        "model": model,
        "created": int(time.time()),
        "prompt_token_ids": req.token_ids,
        "usage": {
            "prompt_tokens": len(req.token_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(req.token_ids) + completion_tokens,
        },
        "choices": choices,
    }


def _logprobs(c: Completion, alternatives: int) -> dict[str, Any]:
    """vLLM's logprobs of a choice: each sampled token's entry with its `alternatives` most likely
    tokens; with 0 alternatives, as vLLM, the sampled token's own entry is its one top entry."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        return {"token": f"token_id:{token}", "token_id": token, "logprob": logprob}

    if alternatives == 0:
        tops = [[(t, lp)] for t, lp in zip(c.token_ids, c.logprobs, strict=True)]
    else:
        tops = c.top_logprobs or [[] for _ in c.token_ids]
    return {
        "content": [
            entry(t, lp) | {"top_logprobs": [entry(a, alp) for a, alp in top]}
            for t, lp, top in zip(c.token_ids, c.logprobs, tops, strict=True)
        ]
    }


def _text(policy: Policy, c: Completion, sp: GenerateSampling) -> str:
    """The sample's text: the sampler's own, or, with `skip_special_tokens` false, decoded with the
    special tokens kept (the end-of-turn token left out and the text cut before a stop string, as vLLM does)."""
    if sp.skip_special_tokens:
        return c.text
    body = (
        c.token_ids[:-1] if c.token_ids and c.token_ids[-1] in policy.prompts.eos_token_ids else c.token_ids
    )
    text = policy.tokenizer.decode(body, skip_special_tokens=False)
    for stop in [sp.stop] if isinstance(sp.stop, str) else sp.stop or []:
        cut = text.find(stop)
        if cut >= 0:
            text = text[:cut]
    return text
