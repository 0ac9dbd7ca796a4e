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

One server can serve several LoRA adapters on one base model: `/v1/models` lists every name and
the request's `model` picks one (`serve.routing` keeps swaps atomic). The `/v1/adapters`
endpoints that load, unload, promote and roll them back at run time are
`grooves.adapters.admin.mount_admin(app)`, mounted by whoever serves the app to adapter
operators (`grooves serve` only with `--admin`); an app from `create_app` alone has none, and
the trainer's servers never mount them. With `api_key` every route needs it (`grooves.asgi.ApiKey`).

`inprocess_client(policy)` gives an `openai.AsyncOpenAI` that reaches this app over an in-memory
ASGI transport: the trainer and tests use the same code path as a remote agent, without a port.

Bad input is a 4xx with an OpenAI-style JSON error body naming the parameter (`serve.errors`),
never a 500 with a traceback; a request field the server does not implement is refused the same
way rather than ignored (`serve.compat`), and unknown routes and methods answer in the same shape.
Limits (see docs/serving.md): the request body (`max_body_bytes`, 413), the largest `n`, and the
tokens one request may ask the sampler for (`n x max_tokens` at most `max_request_tokens`). The
endpoints are in `serve.chat`, `serve.responses` and `serve.generate`, the request pipeline they
share in `serve.pipeline`, streaming in `serve.streaming`, the request and response shapes in
`serve.schemas`.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from grooves.asgi import ApiKey, BodyLimit, ServerErrors
from grooves.policy.base import Policy
from grooves.policy.batching import BatchScheduler
from grooves.serve.chat import chat_router
from grooves.serve.errors import APIError, error_body
from grooves.serve.generate import generate_router
from grooves.serve.keys import ApiKeys, KeyCheck
from grooves.serve.responses.routes import responses_router
from grooves.serve.routing import ModelRoutes

MAX_BODY_BYTES = 8 * 2**20
"""Default request body cap: a context of 128k tokens is about 0.5 MB of text."""
MAX_REQUEST_TOKENS = 65_536
"""Default cap on `n x max_tokens` for one request (64 x 1024), so one request cannot hold the
sampler for minutes while every other request waits behind it."""


def create_app(
    policy: Policy,
    *,
    max_n: int = 64,
    max_batch_rows: int = 64,
    adapters: ModelRoutes | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_request_tokens: int | None = MAX_REQUEST_TOKENS,
    api_key: str | None = None,
    keys: ApiKeys | None = None,
    meter: Callable[[str, int, int], None] | None = None,
) -> FastAPI:
    """The HTTP app over `policy` (a `TransformersPolicy`, a `VLLMPolicy`, any `Policy`).

    `adapters` routes model names to adapters (default: the policy's own name only).
    `max_body_bytes` caps a request body (413); `max_request_tokens` caps `n x max_tokens` of one
    request (400; None: no cap). `api_key`, when set, is required on every route as
    `Authorization: Bearer <key>` (a 401 in OpenAI's shape otherwise, before the body is read);
    `keys` instead names a tenant per key (see `serve.keys`), for the training service.
    `meter(model, prompt_tokens, completion_tokens)` is told about each answered chat completion.
    `app.state` holds the policy, its `BatchScheduler` (close it when the app's owner ends) and the
    adapter table. The adapter admin routes are not in it: `grooves.adapters.admin.mount_admin(app)`.
    """
    if api_key is not None and keys is not None:
        raise ValueError("give create_app api_key (one key) or keys (a tenant per key), not both")
    app = FastAPI(title="grooves policy server")
    scheduler = BatchScheduler(policy, max_batch_rows=max_batch_rows)
    adapters = adapters or ModelRoutes(policy)
    app.state.policy = policy
    app.state.scheduler = scheduler
    app.state.adapters = adapters
    app.add_middleware(
        BodyLimit,
        max_bytes=max_body_bytes,
        too_large=lambda limit: error_body(
            f"the request body is larger than this server's limit of {limit} bytes", code="request_too_large"
        ),
    )
    app.add_middleware(
        ServerErrors,
        body=lambda exc: error_body(f"internal error: {type(exc).__name__}", kind="server_error"),
    )

    def unauthorized(reason: str) -> dict:
        return error_body(
            f"{reason}: send it as the header 'Authorization: Bearer <key>' (the openai client's api_key) "
            "or 'X-API-Key: <key>' (the tinker SDK's)",
            code="invalid_api_key",
        )

    # outermost: a request without a known key is refused before its body is read
    if keys is not None:
        app.add_middleware(KeyCheck, keys=keys, unauthorized=unauthorized)
    elif api_key is not None:
        app.add_middleware(ApiKey, key=api_key, unauthorized=unauthorized)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # unknown routes and methods: OpenAI's error shape, not FastAPI's {"detail": ...}
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; this server has {', '.join(_served_paths(app))}"
            code = "not_found"
        elif exc.status_code == 405:
            message, code = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        else:
            message, code = str(exc.detail), None
        return JSONResponse(
            status_code=exc.status_code, content=error_body(message, code=code), headers=exc.headers
        )

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return JSONResponse(
            status_code=exc.status,
            content=error_body(exc.message, kind=exc.kind, param=exc.param, code=exc.code),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        if first.get("type") == "json_invalid":  # the loc of a JSON error is a character offset
            loc, first = (
                "",
                {
                    "msg": f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})"
                },
            )
        message = f"{loc}: {first.get('msg')}" if loc else str(first.get("msg"))
        return JSONResponse(status_code=400, content=error_body(message, param=loc or None))

    app.include_router(
        chat_router(
            policy, scheduler, adapters, max_n=max_n, max_request_tokens=max_request_tokens, meter=meter
        )
    )
    app.include_router(
        responses_router(policy, scheduler, adapters, max_request_tokens=max_request_tokens, meter=meter)
    )
    app.include_router(
        generate_router(
            policy, scheduler, adapters, max_n=max_n, max_request_tokens=max_request_tokens, meter=meter
        )
    )
    return app


def inprocess_client(policy_or_app, *, api_key: str = "grooves", timeout: float = 600.0):
    """An `openai.AsyncOpenAI` client wired to the app in this process (no sockets)."""
    import httpx
    from openai import AsyncOpenAI

    # the trainer's own requests: its run file bounds them, so no per-request work cap
    app = (
        policy_or_app
        if isinstance(policy_or_app, FastAPI)
        else create_app(policy_or_app, max_request_tokens=None)
    )
    transport = httpx.ASGITransport(app=app)
    http = httpx.AsyncClient(transport=transport, base_url="http://grooves.local", timeout=timeout)
    return AsyncOpenAI(
        base_url="http://grooves.local/v1",
        api_key=api_key,
        http_client=http,  # type: ignore[arg-type]  # openai's stub names httpx2's client; httpx's serves
        max_retries=0,
    )


def serve(policy_or_app, *, host: str = "127.0.0.1", port: int = 8000, **options) -> None:
    """Serve an app (or `create_app(policy, **options)`) with uvicorn until interrupted; grooves' own
    log lines (each answered request, with its `user`) go out beside uvicorn's (`log_config`)."""
    import uvicorn

    app = policy_or_app if isinstance(policy_or_app, FastAPI) else create_app(policy_or_app, **options)
    uvicorn.run(app, host=host, port=port, log_level="info", log_config=log_config())


def log_config() -> dict:
    """uvicorn's logging setup, plus the `grooves` loggers at INFO on uvicorn's stderr handler."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["grooves"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


def _served_paths(app: FastAPI) -> list[str]:
    """The fixed paths this app answers (a 404 lists them): the OpenAI routes, /health, and the
    training service's or the admin routes where they are mounted (FastAPI's docs pages are not in
    its schema)."""
    paths = app.openapi().get("paths", {})  # built once, then cached by FastAPI; in the order added
    return [p for p in paths if "{" not in p]
