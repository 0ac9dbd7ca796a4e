"""Moved to `grooves.envs.sqlite`; kept for compatibility."""

from grooves.envs.sqlite import (
    Call,
    GradeInput,
    LocalEpisode,
    Solver,
    SqliteEnvironment,
    TaskSpec,
    assign_splits,
    play,
)

__all__ = [
    "Call",
    "GradeInput",
    "LocalEpisode",
    "Solver",
    "SqliteEnvironment",
    "TaskSpec",
    "assign_splits",
    "play",
]
