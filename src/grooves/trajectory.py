"""Moved to `grooves.core.gather`, `grooves.core.trajectory`; kept for compatibility."""

from grooves.core.gather import RolloutFn, TooManyFailures, gather
from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup, read_groups, write_jsonl

__all__ = [
    "RolloutFn",
    "SampledTurn",
    "TooManyFailures",
    "Trajectory",
    "TrajectoryGroup",
    "gather",
    "read_groups",
    "write_jsonl",
]
