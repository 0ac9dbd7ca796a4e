"""ASGI middleware shared by the policy server and the environment server.

`BodyLimit` caps a request body by counting the bytes as they arrive, so a chunked upload (no
`Content-Length`) is held to the same limit as a declared one; a check of the header alone let
such uploads through. It buffers the body (both services need it whole anyway) and hands the
app a replay of it, after which `receive` is the server's own again, so an endpoint can still
wait for `http.disconnect`.

`ApiKey` refuses (401) a request that does not carry the server's key, before its body is read.

`ServerErrors` turns an exception that escaped the app into a JSON 500 and returns normally.
Starlette's own handler for `Exception` sends the 500 and then re-raises for logging, and uvicorn
closes a connection whose app raised: the client's next request on that keep-alive connection
was reset, a failure that had nothing to do with it.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("grooves.asgi")


class BodyLimit:
    """Answer `too_large(limit)` (a JSON body, status 413) once a request body passes `max_bytes`."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, too_large: Callable[[int], dict[str, Any]]):
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.app, self.max_bytes, self.too_large = app, max_bytes, too_large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:  # refused before a byte is read
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left while sending; nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replay: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await JSONResponse(self.too_large(self.max_bytes), status_code=413)(scope, receive, send)


class ServerErrors:
    """A JSON 500 (`body(exc)`) for an exception the app let escape, sent without closing the connection."""

    def __init__(self, app: ASGIApp, *, body: Callable[[Exception], dict[str, Any]]):
        self.app, self.body = app, body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # half a response is out: nothing sound can follow it on this connection
                raise
            log.exception("unexpected error in %s %s", scope.get("method"), scope.get("path"))
            await JSONResponse(self.body(exc), status_code=500)(scope, receive, send)


def bearer(scope: Scope) -> tuple[bytes, bytes | None]:
    """(the request's key header, the key it carries), the key None when it carries none: the
    `Authorization` header as `Bearer <key>` (OpenAI's clients), else an `X-API-Key` header (the
    Tinker SDK's)."""
    headers = dict(scope.get("headers") or [])
    header = headers.get(b"authorization", b"")
    if not header and headers.get(b"x-api-key"):
        key = headers[b"x-api-key"]
        return key, key.strip()
    scheme, _, sent = header.partition(b" ")
    return header, sent.strip() if scheme.lower() == b"bearer" else None


async def refuse_unauthorized(body: dict[str, Any], scope: Scope, receive: Receive, send: Send) -> None:
    """The 401 for a request without a known key: `body` as JSON, with `WWW-Authenticate: Bearer`."""
    await JSONResponse(body, status_code=401, headers={"www-authenticate": "Bearer"})(scope, receive, send)


class ApiKey:
    """Answer 401 (`unauthorized(reason)`, a JSON body) to a request without `Authorization: Bearer <key>`.

    Checked before the body is read, on every HTTP route; the comparison takes the same time
    whatever the sent key, so the key cannot be guessed from response times.
    """

    def __init__(self, app: ASGIApp, *, key: str, unauthorized: Callable[[str], dict[str, Any]]):
        if not key:
            raise ValueError("the API key must not be empty")
        self.app, self.key, self.unauthorized = app, key.encode(), unauthorized

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header, sent = bearer(scope)
        if sent is not None and hmac.compare_digest(sent, self.key):
            await self.app(scope, receive, send)
            return
        reason = "no API key was sent" if not header else "the API key is not this server's"
        await refuse_unauthorized(self.unauthorized(reason), scope, receive, send)
