"""The `[logging]` section: what a run writes into its folder besides checkpoints, and where it
shows progress. `grooves sft` reads `LoggingConfig`; `grooves train` the same fields and, having
rollouts to write, `samples_every` (`RunLoggingConfig`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from grooves.config.base import Section


class LoggingConfig(Section):
    """The `[logging]` of `grooves sft`, and what `grooves train`'s shares with it."""

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


class RunLoggingConfig(LoggingConfig):
    """The `[logging]` of `grooves train`."""

    samples_every: int = Field(1, ge=1)
    """Write all trajectories of every K-th step to samples/ (validation's are written at every
    validation)."""
    report: bool = True
    """Write report.html (the curves, the watch's findings, the best and worst samples) when the run
    ends. Its figures take matplotlib several seconds to draw; a sweep of many short runs can turn
    it off and write the report of any run later with `grooves report RUN_DIR`."""
