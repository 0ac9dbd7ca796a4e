"""Moved to `grooves.serve.app`; kept for compatibility."""

from grooves.serve.app import (
    MAX_BODY_BYTES,
    MAX_REQUEST_TOKENS,
    APIError,
    ChatRequest,
    Message,
    ToolCall,
    ToolCallFunction,
    check_content,
    create_app,
    inprocess_client,
    refuse_unsupported,
    serve,
    validate_tools,
)

__all__ = ["APIError", "ChatRequest", "MAX_BODY_BYTES", "MAX_REQUEST_TOKENS", "Message", "ToolCall", "ToolCallFunction", "check_content", "create_app", "inprocess_client", "refuse_unsupported", "serve", "validate_tools"]
