"""Errors of the HTTP API in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every endpoint (chat completions here, the adapter admin routes in `grooves.adapters.admin`)
raises `APIError` for bad input; the app turns it into a JSON response naming the parameter.
"""

from __future__ import annotations

from typing import Any


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
