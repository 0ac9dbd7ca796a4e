"""Moved to `grooves.core.handle`; kept for compatibility."""

from grooves.core.handle import (
    ModelHandle,
)

__all__ = ["ModelHandle"]
