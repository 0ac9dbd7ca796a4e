"""Moved to `grooves.config.watch`; kept for compatibility."""

from grooves.config.watch import (
    CheckDivergenceConfig,
    CollapseConfig,
    InputIndependenceConfig,
    InspectConfig,
    LengthDriftConfig,
    RewardJumpConfig,
    Severity,
    WatchConfig,
)

__all__ = [
    "CheckDivergenceConfig",
    "CollapseConfig",
    "InputIndependenceConfig",
    "InspectConfig",
    "LengthDriftConfig",
    "RewardJumpConfig",
    "Severity",
    "WatchConfig",
]
