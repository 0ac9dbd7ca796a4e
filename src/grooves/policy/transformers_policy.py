"""Moved to `grooves.policy.transformers` and `grooves.policy.base`; kept for compatibility."""

from grooves.policy.base import ContextOverflow
from grooves.policy.transformers import LoraSettings, TransformersPolicy

__all__ = ["ContextOverflow", "LoraSettings", "TransformersPolicy"]
