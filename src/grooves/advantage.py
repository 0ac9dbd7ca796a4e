"""Moved to `grooves.core.advantage`; kept for compatibility."""

from grooves.core.advantage import (
    ESTIMATORS,
    ZERO_VARIANCE_TOL,
    Estimator,
    GroupAdvantages,
    dr_grpo,
    group_advantages,
    grpo,
    rloo,
)

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "GroupAdvantages",
    "ZERO_VARIANCE_TOL",
    "dr_grpo",
    "group_advantages",
    "grpo",
    "rloo",
]
