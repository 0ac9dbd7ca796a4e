"""The `[checkpoint]` section: how often a run saves a checkpoint and which ones it keeps.

`grooves train` and `grooves sft` read the same section (`training.checkpoint.save_if_due` is
the one piece of code that acts on it); `grooves serve --train` keeps its models' checkpoints by it
too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grooves.config.base import Section


class CheckpointConfig(Section):
    every: int = Field(1, ge=1)
    """Checkpoint every K steps, and always after the last; resume loses at most K-1 steps
    (`grooves sft`'s default: 10)."""
    keep: int = Field(3, ge=1)
    """Checkpoints kept on disk: the newest K stay, older ones are deleted as new ones are written
    (except the best, below)."""
    keep_best_by: str = "val/success_rate"
    """A metrics.jsonl key (a validation metric): the checkpoint whose step scored best on it is
    kept besides the newest `keep`, so `--select best` still finds it. Only steps that are both
    validated and checkpointed count. "" keeps no best."""
    keep_best_mode: Literal["max", "min"] = "max"
    """Whether a higher (`max`) or lower (`min`) `keep_best_by` is better."""
