"""Moved to `grooves.core.trajectory`; kept for compatibility."""

from grooves.core.trajectory import (
    RolloutFn,
    SampledTurn,
    TooManyFailures,
    Trajectory,
    TrajectoryGroup,
    gather,
    read_groups,
    write_jsonl,
)

__all__ = ["RolloutFn", "SampledTurn", "TooManyFailures", "Trajectory", "TrajectoryGroup", "gather", "read_groups", "write_jsonl"]
