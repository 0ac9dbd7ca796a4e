"""Moved to `grooves.core.loss`; kept for compatibility."""

from grooves.core.loss import (
    POLICY_LOSSES,
    AggregationMode,
    KLKind,
    PolicyLoss,
    PolicyLossOutput,
    aggregate,
    cispo,
    compute_loss,
    gspo,
    kl_penalty,
    log_ratio,
    ppo_clip,
)

__all__ = [
    "AggregationMode",
    "KLKind",
    "POLICY_LOSSES",
    "PolicyLoss",
    "PolicyLossOutput",
    "aggregate",
    "cispo",
    "compute_loss",
    "gspo",
    "kl_penalty",
    "log_ratio",
    "ppo_clip",
]
