"""Moved to `grooves.serve` (`app`, `chat`, `errors`, `schemas`); kept for compatibility."""

from grooves.serve.app import MAX_BODY_BYTES, MAX_REQUEST_TOKENS, create_app, inprocess_client, serve
from grooves.serve.chat import check_content, refuse_unsupported, validate_tools
from grooves.serve.errors import APIError
from grooves.serve.schemas import ChatRequest, Message, ToolCall, ToolCallFunction

__all__ = [
    "APIError",
    "ChatRequest",
    "MAX_BODY_BYTES",
    "MAX_REQUEST_TOKENS",
    "Message",
    "ToolCall",
    "ToolCallFunction",
    "check_content",
    "create_app",
    "inprocess_client",
    "refuse_unsupported",
    "serve",
    "validate_tools",
]
