"""Moved to `grooves.policy.transformers` and `grooves.policy.base`; kept for compatibility.

`LoraSettings` is the run file's `[lora]` section, `grooves.config.LoraConfig`, under its old name."""

from grooves.config import LoraConfig as LoraSettings
from grooves.policy.base import ContextOverflow
from grooves.policy.transformers import TransformersPolicy

__all__ = ["ContextOverflow", "LoraSettings", "TransformersPolicy"]
