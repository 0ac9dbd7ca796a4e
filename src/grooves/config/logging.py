"""The `[logging]` section: what a run writes into its folder, and how often."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from grooves.config.base import Section


class LoggingConfig(Section):
    samples_every: int = Field(1, ge=1)
    """Write all trajectories of every K-th step to samples/."""
    checkpoint_every: int = Field(1, ge=1)
    """Checkpoint every K steps; resume loses at most K-1 steps."""
    keep_checkpoints: int = Field(3, ge=1)
    """Checkpoints kept on disk: the newest K stay, older ones are deleted as new ones are written
    (except the best, below)."""
    keep_best_by: str = "val/success_rate"
    """A metrics.jsonl key (a validation metric): the checkpoint whose step scored best on it is
    kept besides the newest `keep_checkpoints`, so `--select best` still finds it. Only steps that
    are both validated and checkpointed count. "" keeps no best."""
    keep_best_mode: Literal["max", "min"] = "max"
    """Whether a higher (`max`) or lower (`min`) `keep_best_by` is better."""
    progress: bool = True
    """Progress bars on a terminal. Without bars (false, or output that is not a terminal, such as a
    log file) the run writes one line per step, and a heartbeat line every minute while a step's
    rollouts or a validation run, so a long run is never silent."""
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "trackio"]] = []
    """Experiment trackers that mirror each step's metrics, the resolved config and the sample
    tables, through their own libraries (optional extras: `pip install 'grooves[trackers]'`).
    TensorBoard event files and an MLflow file store go into the run folder, W&B as an offline
    run (`wandb sync` uploads it later), Trackio into its local database. One that cannot start
    is named on one line and the run goes on without it (`grooves.training.trackers`)."""
    project: str = "grooves"
    """The W&B and Trackio project and the MLflow experiment the run is logged under (the run's
    own name is `name`)."""

    @field_validator("report_to")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("names a tracker twice; list each once")
        return value
