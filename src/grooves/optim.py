"""Moved to `grooves.train.optim`; kept for compatibility."""

from grooves.train.optim import (
    adamw,
)

__all__ = ["adamw"]
