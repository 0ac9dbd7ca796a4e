"""Errors of the HTTP API in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every endpoint (chat completions here, the adapter admin routes in `grooves.adapters.admin`)
raises `APIError` for bad input; the app turns it into a JSON response naming the parameter.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("grooves.server")


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def error_body(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape; `kind` is its `type` field."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sampling_error(exc: BaseException) -> APIError:
    """A request's failure while it was sampled: a grammar that reached a limit is the request's own
    (a 400 naming the field); anything else is the server's (a 500). Logged either way."""
    from grooves.policy.constraints import GrammarFailed  # torch: not for the commands that only name errors

    if isinstance(exc, GrammarFailed):
        log.warning("request refused while sampling: %s", exc)
        return APIError(400, str(exc), exc.param)
    log.error("sampling failed: %s: %s", type(exc).__name__, exc)
    return APIError(500, f"sampling failed: {type(exc).__name__}: {exc}", kind="server_error")
