"""Moved to `grooves.policy.transformers`; kept for compatibility."""

from grooves.policy.transformers import (
    ContextOverflow,
    LoraSettings,
    TransformersPolicy,
)

__all__ = ["ContextOverflow", "LoraSettings", "TransformersPolicy"]
