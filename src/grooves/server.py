"""Moved to `grooves.serve` (`app`, `chat`, `errors`, `schemas`); kept for compatibility."""

from grooves.serve.app import MAX_BODY_BYTES, MAX_REQUEST_TOKENS, create_app, inprocess_client, serve
from grooves.serve.chat import check_content, check_fields, validate_tools
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
    "check_fields",
    "create_app",
    "inprocess_client",
    "serve",
    "validate_tools",
]
