"""Moved to `grooves.train` (`loop`, `step`, `data`, `checkpoint`) and `grooves.core.batching`; kept for compatibility."""

from grooves.core.batching import MIN_SHARED_PREFIX, micro_batches
from grooves.train.checkpoint import seed_everything
from grooves.train.data import ScenarioStream
from grooves.train.loop import GroupScorer, RunInterrupted, StepObserver, build_policy, run, train, validate
from grooves.train.step import NonFiniteStep, optimize, to_sequences

__all__ = [
    "GroupScorer",
    "MIN_SHARED_PREFIX",
    "NonFiniteStep",
    "RunInterrupted",
    "ScenarioStream",
    "StepObserver",
    "build_policy",
    "micro_batches",
    "optimize",
    "run",
    "seed_everything",
    "to_sequences",
    "train",
    "validate",
]
