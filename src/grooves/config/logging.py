"""The `[logging]` section: what a run writes into its folder, and how often."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grooves.config.base import Section


class LoggingConfig(Section):
    samples_every: int = Field(1, ge=1)
    """Write all trajectories of every K-th step to samples/."""
    checkpoint_every: int = Field(1, ge=1)
    """Checkpoint every K steps; resume loses at most K-1 steps."""
    keep_checkpoints: int = Field(3, ge=1)
    """The newest K checkpoints stay; older ones are deleted (except the best, below)."""
    keep_best_by: str = "val/success_rate"
    """A metrics.jsonl key (a validation metric): the checkpoint whose step scored best on it is
    kept besides the newest `keep_checkpoints`, so `--select best` still finds it. Only steps that
    are both validated and checkpointed count. "" keeps no best."""
    keep_best_mode: Literal["max", "min"] = "max"
    """Whether a higher (`max`) or lower (`min`) `keep_best_by` is better."""
    progress: bool = True
