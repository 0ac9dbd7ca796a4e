"""Moved to `grooves.core.forward`; kept for compatibility."""

from grooves.core.forward import (
    kept_positions,
    shared_prefix_logprobs,
    token_logprobs,
)

__all__ = ["kept_positions", "shared_prefix_logprobs", "token_logprobs"]
